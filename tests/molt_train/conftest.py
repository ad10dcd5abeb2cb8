"""Fixtures of the trainer's tests: a local Ray instance, started the way ``molt-train`` starts one."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def ray_local():
    """A local Ray instance with 2 CPUs for the module's tests (``init_ray`` retries a start-up that timed out on a
    loaded host); shut down after the module."""
    import ray

    from molt_train.config import RayConfig
    from molt_train.runtime import init_ray

    init_ray(RayConfig(num_cpus=2))
    yield
    ray.shutdown()
