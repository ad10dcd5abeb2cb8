"""``molt-train eval --env ID [--env ID2 ...] --actor.model_name_or_path DIR``: greedy accuracy on held-out splits,
in-process; one JSON line, with each env's figures (``<ID>/accuracy``, ...) next to the overall ones, and
``env_lock``: the envs scored (``env_registry.mix.env_lock``: ID, package, version, spec hash, weight)."""

from __future__ import annotations

import json
from collections.abc import Sequence

from env_registry.mix import env_lock
from molt_train.config.commands import parse
from molt_train.data import env_mix
from molt_train.rollout import evaluate_checkpoint
from molt_train.runtime import quiet


def main(argv: Sequence[str] | None = None) -> int:
    cfg = parse("eval", argv)
    quiet()
    result = evaluate_checkpoint(cfg, cfg.actor.model_name_or_path)
    mix = env_mix(cfg)
    ids = [entry.env_id for entry in mix]
    env = ids[0] if len(ids) == 1 else ids  # one env: its ID, as before mixes existed
    print(json.dumps({"env": env, "split": cfg.eval.split, **result, "env_lock": env_lock(mix)}))
    return 0
