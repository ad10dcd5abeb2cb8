"""``--eval.eval_only``: score ``--actor.model_name_or_path`` through one rollout worker and nothing else.

No trainer ranks, no reference, no placement group (the vllm engine takes one whole GPU): the checkpoint's eval rows
go through the ``RolloutWorker`` every RL run starts (``rollout.start_rollout_worker``), on a Ray cluster like a
training run's (its isolated installs served on the driver's node, every node's paths checked). Writes
``metrics.jsonl`` (step 0), ``eval_results.json`` and ``molt_env_lock.json`` under ``--ckpt.output_dir``.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

from env_registry.mix import env_lock, write_lock
from molt_train.config.commands import RLConfig
from molt_train.config.inert import inert_warnings
from molt_train.data import env_mix, load_eval_rows
from molt_train.env_server_actors import isolated_installs, serve_here
from molt_train.metrics import MetricsLogger
from molt_train.node_paths import check_every_node, shared_paths
from molt_train.rollout import eval_sampling, start_rollout_worker
from molt_train.runtime import cpu_threads, init_ray


def evaluate_once(cfg: RLConfig) -> dict[str, float]:
    """``--eval.eval_only``: score ``--actor.model_name_or_path`` on the eval rows through the rollout engine and
    nothing else (no trainer ranks, no reference, no placement group: the vllm engine takes one whole GPU). Writes
    ``metrics.jsonl`` (step 0) and ``eval_results.json`` under ``--ckpt.output_dir``; returns the ``eval/*``
    metrics."""
    import ray

    output_dir = Path(cfg.ckpt.output_dir).resolve()
    output_dir.mkdir(parents=True, exist_ok=True)
    init_ray(cfg.ray)
    model_path = str(Path(cfg.actor.model_name_or_path).resolve())
    gpus = float(cfg.vllm.gpus_per_engine) if cfg.rollout.engine == "vllm" else 0.0
    installs = isolated_installs(e.env_id for e in env_mix(cfg))
    paths = shared_paths(cfg, installs)
    paths.pop("--ckpt.output_dir")  # only the driver writes there
    check_every_node(paths)
    servers = serve_here(installs)  # the eval rows come from them
    rollout = start_rollout_worker(
        cfg,
        model_path,
        num_gpus=gpus,
        num_threads=cpu_threads(cfg.actor.num_threads, 1),
        options={},
        env_installs=installs,
    )
    try:
        t = time.perf_counter()
        rows = load_eval_rows(cfg)
        result = ray.get(rollout.evaluate.remote(rows, eval_sampling(cfg), cfg.eval.n_samples_per_prompt))
        metrics = {f"eval/{k}": v for k, v in result.items()} | {"timing/eval_s": time.perf_counter() - t}
    finally:
        try:
            stops = [rollout.shutdown.remote()] + [s.stop.remote() for s in servers]
            ray.wait(stops, num_returns=len(stops), timeout=60)
        finally:
            for actor in (rollout, *servers):
                ray.kill(actor)
    logger = MetricsLogger(
        output_dir, 0, progress=False, description="eval", logger=cfg.logger, config=dataclasses.asdict(cfg)
    )
    logger.log(0, metrics)
    logger.close()
    source = {"dataset": cfg.eval.dataset} if cfg.eval.dataset else {"split": cfg.eval.split}
    warnings = inert_warnings(cfg, "rl")  # the training flags of a training command line: recorded, not refused
    record = {"env": cfg.env, "model": model_path, **source, "sampling": eval_sampling(cfg), **metrics}
    record["flag_warnings"] = warnings
    record["env_lock"] = env_lock(env_mix(cfg))  # the envs scored, also as molt_env_lock.json
    write_lock(output_dir, record["env_lock"])
    (output_dir / "config.json").write_text(json.dumps(dataclasses.asdict(cfg) | {"flag_warnings": warnings}, indent=1))
    (output_dir / "eval_results.json").write_text(json.dumps(record, indent=1))
    return metrics


__all__ = ["evaluate_once"]
