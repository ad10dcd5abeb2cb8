"""``molt-train rl --env ID ...``: online RL on a registered env (flags: ``molt-train rl --help``)."""

from __future__ import annotations

import json
from collections.abc import Sequence

from molt_train.config.commands import parse
from molt_train.eval_only import evaluate_once
from molt_train.rl_trainer import RLTrainer


def main(argv: Sequence[str] | None = None) -> int:
    cfg = parse("rl", argv)
    if cfg.eval.eval_only:
        metrics = evaluate_once(cfg)
        print(json.dumps({"env": cfg.env, "eval_dataset": cfg.eval.dataset, **metrics}))
        return 0
    trainer = RLTrainer(cfg)
    if trainer.resumed_from is not None:
        print(f"resumed from step {trainer.start_step} ({trainer.resumed_from})", flush=True)
    elif cfg.ckpt.load_enable:
        print(f"--ckpt.load_enable: no checkpoint in {trainer.output_dir}, starting from step 0", flush=True)
    try:
        last = trainer.run()
    finally:
        trainer.shutdown()
    acc = last.get("eval/accuracy")
    print(
        f"rl done: {cfg.train.num_steps} steps, final model in {trainer.output_dir / 'hf'}"
        + (f", held-out {cfg.eval.split} accuracy {acc:.3f}" if acc is not None else "")
    )
    return 0
