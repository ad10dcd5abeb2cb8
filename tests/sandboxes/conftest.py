"""Fixtures for the sandbox suites: a resource guard around the whole test process, the list of
providers this host can run, and a canary secret planted in the host environment."""

from __future__ import annotations

import contextlib
import os
import shutil

import pytest

import sandboxes
from sandboxes import cgroups

# Planted before any pool starts, so every worker's launcher inherits it if anything leaks.
CANARY = "molt-canary-5f0c2b7e9d"
os.environ["MOLT_SANDBOX_CANARY_SECRET"] = CANARY

GUARD_PIDS = 3000  # threads count too; Ray alone runs a few hundred
GUARD_MEMORY_MB = 8192
_REPORT = sandboxes.probe()


def _docker_ready() -> bool:
    return _REPORT.docker is not None and shutil.which("docker") is not None


def available_providers() -> list:
    params = []
    local_skip = pytest.mark.skipif(
        bool(_REPORT.local_missing), reason="local isolation unavailable: " + "; ".join(_REPORT.local_missing)
    )
    params.append(pytest.param("local", marks=local_skip, id="local"))
    ray_skip = pytest.mark.skipif(
        not _REPORT.ray or bool(_REPORT.local_missing), reason="ray not installed or no local isolation for its actors"
    )
    params.append(pytest.param("ray", marks=ray_skip, id="ray"))
    docker_skip = pytest.mark.skipif(
        not _docker_ready(), reason=f"docker provider unavailable: {_REPORT.docker_detail}"
    )
    params.append(pytest.param("docker", marks=docker_skip, id="docker"))
    return params


@pytest.fixture(scope="session")
def resource_guard():
    """Run the whole test process (and so every jail it starts) inside a pids+memory cgroup, so a
    sandbox that failed to contain a fork or memory bomb still could not take the machine down."""
    if not (_REPORT.root and _REPORT.cgroup == "v1" and _REPORT.cgroup_writable):
        pytest.skip("bomb tests need a writable cgroup v1 pids+memory hierarchy (run as root)")
    me = str(os.getpid())
    dirs = {}
    for controller, limit_file, value in (
        ("pids", "pids.max", str(GUARD_PIDS)),
        ("memory", "memory.limit_in_bytes", str(GUARD_MEMORY_MB << 20)),
    ):
        parent = os.path.join(cgroups.ROOT, controller, cgroups._own_path(controller).lstrip("/"))
        path = os.path.join(parent, f"sandbox-tests-{me}")
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, limit_file), "w") as handle:
            handle.write(value)
        with open(os.path.join(path, "cgroup.procs"), "w") as handle:
            handle.write(me)
        dirs[controller] = (parent, path)
    yield dirs
    sandboxes.shutdown()
    for parent, path in dirs.values():
        with open(os.path.join(parent, "cgroup.procs"), "w") as handle:
            handle.write(me)
        with contextlib.suppress(OSError):
            os.rmdir(path)


@pytest.fixture(params=available_providers())
def provider(request, resource_guard) -> str:
    return request.param
