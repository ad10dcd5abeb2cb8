"""``molt-train sft --env ID --model.config tiny --ckpt.output_dir DIR``: supervised fine-tuning on an env's reference
completions (flags: ``molt-train sft --help``), then the held-out accuracy of the result."""

from __future__ import annotations

import time
from collections.abc import Sequence

from molt_train.config.commands import parse
from molt_train.data import env_mix
from molt_train.rollout import evaluate_checkpoint
from molt_train.sft_trainer import SFTTrainer


def main(argv: Sequence[str] | None = None) -> int:
    cfg = parse("sft", argv)
    t0 = time.perf_counter()
    trainer = SFTTrainer(cfg)
    try:
        final = trainer.run()
    finally:
        trainer.shutdown()
    print(f"sft done: {cfg.train.num_steps} steps in {time.perf_counter() - t0:.1f}s, model in {final}")
    if cfg.env and cfg.eval.max_samples != 0:
        result = evaluate_checkpoint(cfg, final)
        print(f"held-out {cfg.eval.split} accuracy {result['accuracy']:.3f} ({int(result['num_rows'])} rows)")
        for entry in env_mix(cfg) if len(cfg.env) > 1 else ():
            acc, n = result[f"{entry.env_id}/accuracy"], int(result[f"{entry.env_id}/num_rows"])
            print(f"  {entry.env_id}: {acc:.3f} ({n} rows)")
    return 0
