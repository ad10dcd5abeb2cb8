"""Runs last (file order): after every suite above, nothing may be left behind: no jailed or worker
process, no per-slot cgroup, no scratch directory."""

from __future__ import annotations

import glob
import os
import tempfile
import time

import sandboxes
from sandboxes import local


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


def test_nothing_is_left_behind(resource_guard):
    sandboxes.shutdown()  # also stops Ray if the ray provider started it
    guard_dirs = [path for _, path in resource_guard.values()]
    me = os.getpid()
    deadline = time.monotonic() + 20  # Ray's own processes take a moment to exit on a busy machine

    def settled() -> bool:
        return not any(_processes_in(d) - {me} for d in guard_dirs) and not _zombies_of_this_run()

    while not settled() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert [sorted(_processes_in(d) - {me}) for d in guard_dirs] == [[] for _ in guard_dirs]
    assert _zombies_of_this_run() == []
    assert _leftover_cgroups(guard_dirs) == []
    assert _our_containers() == []


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
    assert glob.glob(os.path.join(tempfile.gettempdir(), "sandboxes-unsafe-*")) == []
