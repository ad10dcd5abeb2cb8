"""Fixtures for the sandbox suites: a resource guard around the whole test process (which, when the session ends,
checks that nothing was left behind), the list of providers this host can run, and a canary secret planted in the
host environment."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import tempfile
import time

import pytest

import sandboxes
from sandboxes import cgroups, local

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
    try:
        left = leftovers([path for _, path in dirs.values()])
    finally:
        for parent, path in dirs.values():
            with open(os.path.join(parent, "cgroup.procs"), "w") as handle:
                handle.write(me)
            with contextlib.suppress(OSError):
                os.rmdir(path)
    assert left == {"processes": [], "zombies": [], "cgroups": [], "containers": [], "scratch dirs": []}


@pytest.fixture(params=available_providers())
def provider(request, resource_guard) -> str:
    return request.param


# ---- what the session must not leave behind (checked when the resource guard is torn down, whatever ran last) ----


def leftovers(guard_dirs: list[str]) -> dict[str, list]:
    """After `sandboxes.shutdown()`: processes still in the guard's cgroups (but us), zombies of this run's jails,
    per-slot cgroups, this process's containers and unsafe scratch dirs."""
    sandboxes.shutdown()  # also stops Ray if the ray provider started it
    me = os.getpid()
    deadline = time.monotonic() + 20  # Ray's own processes take a moment to exit on a busy machine

    def processes() -> list[int]:
        return sorted(set().union(*(_processes_in(d) for d in guard_dirs)) - {me})

    while (processes() or _zombies_of_this_run()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return {
        "processes": processes(),
        "zombies": _zombies_of_this_run(),
        "cgroups": _leftover_cgroups(guard_dirs),
        "containers": _our_containers(),
        "scratch dirs": glob.glob(os.path.join(tempfile.gettempdir(), f"sandboxes-unsafe-{me}-*")),
    }


def _processes_in(cgroup_dir: str) -> set[int]:
    found = set()
    for root, _, files in os.walk(cgroup_dir):
        if "cgroup.procs" in files:
            with open(os.path.join(root, "cgroup.procs")) as handle:
                found.update(int(line) for line in handle if line.strip())
    return found


def _zombies_of_this_run() -> list[str]:
    """Dead-but-unreaped jail processes whose per-slot uid belongs to this test process."""
    first = local.slot_uid(0)
    found = []
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            with open(f"/proc/{pid}/status") as handle:
                status = dict(line.split(":", 1) for line in handle if ":" in line)
        except OSError:
            continue
        uid = int(status["Uid"].split()[0])
        if first <= uid < first + local.SLOTS_PER_PROCESS or status["State"].strip().startswith("Z") and uid == 65534:
            found.append(f"{pid} uid={uid} state={status['State'].strip()} {status['Name'].strip()}")
    return found


def _leftover_cgroups(guard_dirs: list[str]) -> list[str]:
    found = []
    for base in guard_dirs:
        for root, dirs, _ in os.walk(base):
            found += [os.path.join(root, d) for d in dirs if d.startswith(local.CGROUP_PREFIX)]
    return found


def _our_containers() -> list[str]:
    if sandboxes.probe().docker is None:
        return []
    import docker

    from sandboxes import docker_pool

    client = docker.from_env()
    try:
        found = client.containers.list(all=True, filters={"label": f"{docker_pool.OWNER_LABEL}={docker_pool._owner()}"})
        return [c.name for c in found]
    finally:
        client.close()
