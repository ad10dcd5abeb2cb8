"""Orphans (issue 42 §3): a run killed by SIGKILL leaves nothing behind once the next run starts.

A subprocess opens 100 persistent local sessions (a REPL with state in each), a few unsafe ones (scratch dirs in the
host's temp dir) and, when an engine answers, a few docker ones; it reports ready and is SIGKILLed. Its jails' processes
must be gone within seconds by themselves (each launcher's parent-death signal); what no signal can remove (cgroup
dirs, scratch dirs, containers) is tagged with its owner and must be gone after the next pool's start.
Runs inside the resource guard's pids+memory cgroup, as every jail of these suites does."""

from __future__ import annotations

import glob
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

import sandboxes
from sandboxes import cgroups, local, owner

pytestmark = pytest.mark.timeout(120)

SESSIONS = 100
PER_POOL = 25  # a pool serves at most 32 persistent sessions: four pools (told apart by recycle_after)
UNSAFE_SESSIONS = 4
DOCKER_SESSIONS = 3
REPORT = sandboxes.probe()
DOCKER = REPORT.docker is not None and shutil.which("docker") is not None  # as conftest decides for the docker tests

CHILD = textwrap.dedent(
    """
    import asyncio, json, sys, time
    import sandboxes
    from sandboxes import jail, owner

    async def start(sessions, **options):
        opened = [sandboxes.open(persistent=True, wall_s=30, **options, **extra) for extra in sessions]
        await asyncio.gather(*(sb.start() for sb in opened))
        results = await asyncio.gather(*(sb.run_python("state = 41\\nstate + 1") for sb in opened))
        assert all(r.stdout == "42\\n" for r in results), [r for r in results if r.stdout != "42\\n"][:2]
        return opened

    async def main(sessions, per_pool, unsafe, docker):
        held = await start(
            [{"recycle_after": 10_000 + i // per_pool} for i in range(sessions)], provider="local", workers=1
        )
        if docker:
            held += await start([{}] * docker, provider="docker", workers=1, recycle_after=10_001)
        jail.bwrap_version = lambda: None  # as on a host without bubblewrap: unsafe workers with scratch dirs
        held += await start([{}] * unsafe, provider="local", workers=1, unsafe=True, recycle_after=10_002)
        for sb in held[:: len(held) // 8]:  # a few sessions are busy when the run dies: a cell that never ends
            asyncio.ensure_future(sb.run_python("import time\\nwhile True: time.sleep(1)", wall_s=300))
        await asyncio.sleep(1)
        print(json.dumps({"ready": len(held), "tag": owner.tag()}), flush=True)
        time.sleep(600)

    asyncio.run(main(*map(int, sys.argv[1:])))
    """
)


def _children() -> dict[int, list[int]]:
    """Every process's children, from /proc (ppid is the 2nd field after the command name)."""
    tree: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as handle:
                    ppid = int(handle.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            tree.setdefault(ppid, []).append(int(name))
    return tree


def _descendants(pid: int) -> dict[int, int]:
    """The live descendants of `pid`: {pid: start ticks}, so a reused pid is never taken for one of them."""
    tree, found, todo = _children(), {}, [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            ticks = owner.start_ticks(child)
            if ticks is not None:
                found[child] = ticks
                todo.append(child)
    return found


def _groups_of(pid: int) -> list[str]:
    """The cgroup group dirs that process `pid` made, anywhere in the hierarchy."""
    found = []
    for top in cgroups._tops(cgroups.version()) if cgroups.version() else []:
        for root, dirs, _ in os.walk(top):
            found += [os.path.join(root, d) for d in dirs if d.startswith(f"{local.CGROUP_PREFIX}{pid}-")]
    return found


def _containers_of(tag: str) -> list[str]:
    import docker

    from sandboxes import docker_pool

    client = docker.from_env()
    try:
        label = f"{docker_pool.OWNER_LABEL}={docker_pool.socket.gethostname()}:{tag}"
        return [c.name for c in client.containers.list(all=True, filters={"label": label})]
    finally:
        client.close()


def _ready_line(proc: subprocess.Popen, timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if select.select([proc.stdout], [], [], 1)[0]:
            line = proc.stdout.readline()
            if not line:
                break
            return json.loads(line)
    proc.kill()
    raise AssertionError(f"the run did not get ready: rc={proc.wait()} stderr={proc.stderr.read()[-3000:]}")


@pytest.mark.skipif(bool(REPORT.local_missing), reason="local isolation unavailable on this host")
async def test_a_run_killed_with_100_open_sessions_leaves_nothing_after_the_next_start(resource_guard):
    docker = DOCKER_SESSIONS if DOCKER else 0
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(SESSIONS), str(PER_POOL), str(UNSAFE_SESSIONS), str(docker)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        ready = _ready_line(proc, timeout_s=60)
        assert ready["ready"] == SESSIONS + UNSAFE_SESSIONS + docker
        processes = _descendants(proc.pid)
        assert len(processes) >= 3 * (SESSIONS + UNSAFE_SESSIONS)  # per jail: launcher, bwrap, zygote, REPL, ...
        scratch = glob.glob(os.path.join(tempfile.gettempdir(), f"{local.SCRATCH_PREFIX}{proc.pid}-*"))
        assert len(scratch) == UNSAFE_SESSIONS
        groups = _groups_of(proc.pid)
        if cgroups.writable() and os.geteuid() == 0:
            assert groups, "the run's jails had no cgroups"
        if docker:
            assert len(_containers_of(ready["tag"])) == docker
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()

    # Processes die by themselves: each launcher's parent-death signal, then the launcher kills its jail.
    deadline = time.monotonic() + 15
    while (
        left := [p for p, ticks in processes.items() if owner.start_ticks(p) == ticks]
    ) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"{len(left)} of the run's {len(processes)} processes outlived it"

    # What outlives every process (a cgroup, a dir, a container) is removed by the next start, found by its owner tag.
    assert owner.gone(ready["tag"])
    async with sandboxes.open("local", workers=1, recycle_after=10_003) as sb:
        assert (await sb.run_python("print('next run')")).stdout == "next run\n"
    assert [g for g in groups if os.path.exists(g)] == []
    assert _groups_of(proc.pid) == []
    assert glob.glob(os.path.join(tempfile.gettempdir(), f"{local.SCRATCH_PREFIX}{proc.pid}-*")) == []
    if docker:
        assert sandboxes.reap()["containers"] >= docker
        assert _containers_of(ready["tag"]) == []


def test_owner_tags_tell_a_reused_pid_from_its_owner():
    me = owner.tag()
    pid, start, namespace = me.split("-")
    assert not owner.gone(me) and not owner.gone(pid)
    assert owner.gone(f"{pid}-{int(start) + 1}-{namespace}")  # same pid, started at another time: not the owner
    assert owner.gone(f"{2**22 + 17}-{start}-{namespace}") and owner.gone(str(2**22 + 17))  # above pid_max
    assert not owner.gone(f"{2**22 + 17}-{start}-{int(namespace) + 1}")  # another pid namespace: never judged
    assert not owner.gone("not-a-tag") and not owner.gone("")
    zombie = subprocess.Popen(["true"])  # exits at once, and stays a zombie until we wait for it
    deadline = time.monotonic() + 10
    while owner.start_ticks(zombie.pid) is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert os.path.exists(f"/proc/{zombie.pid}") and owner.gone(f"{zombie.pid}-0-{namespace}")
    zombie.wait()


def test_docker_reaper_removes_only_containers_of_dead_owners_on_this_host():
    """The engine's side of the reaper, on a stand-in client (the live engine's side is the test above)."""
    from sandboxes import docker_pool

    host = docker_pool.socket.gethostname()
    pid, start, namespace = owner.tag().split("-")
    labels = {
        "mine": docker_pool._owner(),
        "dead": f"{host}:{2**22 + 17}-{start}-{namespace}",
        "reused pid": f"{host}:{pid}-{int(start) + 1}-{namespace}",
        "older label, dead": f"{host}:{2**22 + 17}",
        "older label, alive": f"{host}:{pid}",
        "other host": f"not-{host}:{2**22 + 17}-{start}-{namespace}",
        "other pid namespace": f"{host}:{2**22 + 17}-{start}-{int(namespace) + 1}",
        "unlabelled": "",
    }

    class Container:
        def __init__(self, name: str) -> None:
            self.name, self.labels = name, {docker_pool.LABEL: "1", docker_pool.OWNER_LABEL: labels[name]}

        def remove(self, force: bool) -> None:
            removed.append(self.name)

    class Client:
        class containers:  # noqa: N801  (the docker SDK's shape)
            @staticmethod
            def list(all: bool, filters: dict) -> list[Container]:  # noqa: A002
                assert all and filters == {"label": docker_pool.LABEL}
                return [Container(name) for name in labels]

    removed: list[str] = []
    assert docker_pool.reap_orphans(Client()) == 3
    assert sorted(removed) == ["dead", "older label, dead", "reused pid"]
