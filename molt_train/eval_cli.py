"""``molt-train eval --env ID --actor.model_name_or_path DIR``: greedy accuracy on a held-out split, in-process."""

from __future__ import annotations

import json
from collections.abc import Sequence

from molt_train.config import parse
from molt_train.rollout import evaluate_checkpoint
from molt_train.runtime import quiet


def main(argv: Sequence[str] | None = None) -> int:
    cfg = parse("eval", argv)
    quiet()
    result = evaluate_checkpoint(cfg, cfg.actor.model_name_or_path)
    print(json.dumps({"env": cfg.env, "split": cfg.eval.split, **result}))
    return 0
