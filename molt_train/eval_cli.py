"""``molt-train eval --env ID --actor.model_name_or_path DIR``: greedy accuracy on a held-out split, in-process."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace

from molt_train.config import parse
from molt_train.data import load_rows
from molt_train.rollout import RolloutWorker
from molt_train.trainer import quiet


def evaluate(cfg: SimpleNamespace, model_path: str | Path) -> dict[str, float]:
    """Evaluate ``model_path`` on ``--eval.split`` of ``--env`` (greedy unless ``--eval.temperature``)."""
    rows = load_rows(cfg, cfg.eval.split)[: cfg.eval.max_samples]
    worker = RolloutWorker(
        str(model_path),
        env_id=cfg.env,
        agent_path=cfg.train.agent_path,
        max_len=cfg.data.max_len,
        timeout_s=cfg.rollout.timeout_s,
        max_batch_size=cfg.rollout.max_batch_size,
    )
    params = {"temperature": cfg.eval.temperature, "max_tokens": cfg.eval.max_new_tokens or cfg.rollout.max_new_tokens}
    return asyncio.run(worker.evaluate(rows, params))


def main(argv: Sequence[str] | None = None) -> int:
    cfg = parse("eval", argv)
    quiet()
    result = evaluate(cfg, cfg.actor.model_name_or_path)
    print(json.dumps({"env": cfg.env, "split": cfg.eval.split, **result}))
    return 0
