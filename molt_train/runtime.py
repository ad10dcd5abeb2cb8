"""The process-level setup every command shares: quiet library logging and a Ray instance to place actors on."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from molt_train.config.groups import RayConfig

QUIET = {"HF_HUB_DISABLE_PROGRESS_BARS": "1", "TRANSFORMERS_VERBOSITY": "error", "TOKENIZERS_PARALLELISM": "false"}


def quiet() -> None:
    """No per-file progress bars from transformers / huggingface_hub in this process or its Ray workers."""
    os.environ.update(QUIET)
    from transformers.utils import logging

    logging.disable_progress_bar()


def init_ray(ray_cfg: RayConfig) -> None:
    """Join ``--ray.address`` or start a local instance (a test may have started one already; a local start that
    timed out is tried once more)."""
    import ray

    quiet()
    for attempt in (1, 2):
        if ray.is_initialized():
            return
        try:
            ray.init(
                address=ray_cfg.address,
                num_cpus=None if ray_cfg.address else ray_cfg.num_cpus,
                include_dashboard=False,
                runtime_env={"env_vars": QUIET},
            )
        except Exception as exc:
            # a loaded host: the raylet gives up waiting for its agent's port file (ray-project/ray#65983); a local
            # instance is started once more
            if ray_cfg.address or attempt == 2 or "timed out during startup" not in str(exc):
                raise
            ray.shutdown()


def cpu_threads(num_threads: int, concurrent: int, host_cpus: int | None = None) -> int:
    """``--actor.num_threads`` when set, else the host's cores shared by the ``concurrent`` processes that compute at
    the same time (a Ray actor would otherwise get one thread)."""
    return num_threads or max(1, (host_cpus or os.cpu_count() or 1) // max(concurrent, 1))
