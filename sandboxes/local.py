"""The `local` provider: warm zygotes in bubblewrap jails on this host (sandboxes digest §4.2).

Each live worker gets its own unprivileged uid (when we run as root) and its own cgroup (when cgroups are
writable), so RLIMIT_NPROC is enforced per jail and a runaway jail cannot starve its neighbours. Both are keyed by a
slot number unique among the process's live workers across all its pools (``_SLOT_NUMBERS``): two pools' jails never
share a uid or a cgroup, so closing one worker never kills another pool's jail.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sysconfig
import tempfile
import threading

from sandboxes import cgroups, jail, owner, probe
from sandboxes.cgroups import SlotCgroup
from sandboxes.errors import SandboxUnavailable
from sandboxes.limits import Limits
from sandboxes.pool import PoolBackend, WorkerPool
from sandboxes.worker import JailWorker, default_python

UID_BASE = 100_000
CGROUP_PREFIX = "sandboxes-"  # + the owner tag: a pool's group of per-slot cgroups
SCRATCH_PREFIX = "sandboxes-unsafe-"  # + the owner tag, the slot and a random tail: an unsafe worker's scratch dir


def host_site_packages() -> list[str]:
    """This interpreter's site-packages dirs, to expose read-only in the jail (e.g. for numpy/sympy).

    Returns:
        The existing purelib/platlib directories, sorted: pass them as `site_packages=` to `sandboxes.open("local")`.
    """
    paths = {sysconfig.get_paths()[key] for key in ("purelib", "platlib")}
    return sorted(p for p in paths if os.path.isdir(p))


SLOTS_PER_PROCESS = 2048  # live workers of every local pool of the process (pool workers + persistent sessions)


class _SlotNumbers:
    """The slot numbers (uid and cgroup keys) of this process's live local workers, lowest free first."""

    def __init__(self, size: int) -> None:
        self._free = set(range(size))
        self._lock = threading.Lock()

    def take(self) -> int:
        with self._lock:
            if not self._free:
                raise RuntimeError(
                    f"{SLOTS_PER_PROCESS} local jails are alive in this process (the workers of all its local pools "
                    "plus their persistent sessions); close some sessions, or pools with sandboxes.shutdown()"
                )
            number = min(self._free)
            self._free.remove(number)
            return number

    def give(self, number: int) -> None:
        with self._lock:
            self._free.add(number)


_SLOT_NUMBERS = _SlotNumbers(SLOTS_PER_PROCESS)


def _world_reachable(path: str) -> bool:
    """Whether any uid can traverse to and execute `path` (what an unprivileged slot uid needs)."""
    for candidate in {os.path.abspath(path), os.path.realpath(path)}:
        parts = candidate.split("/")
        for i in range(2, len(parts)):
            if not os.stat("/".join(parts[:i])).st_mode & 0o001:
                return False
    return bool(os.stat(os.path.realpath(path)).st_mode & 0o001)


def slot_uid(slot: int) -> int:
    """A uid owned by no one, distinct per (host process, slot): NPROC and file ownership stay per jail."""
    if not 0 <= slot < SLOTS_PER_PROCESS:
        raise ValueError(f"slot {slot} out of range: at most {SLOTS_PER_PROCESS} workers plus sessions per process")
    return UID_BASE + (os.getpid() % 10_000) * SLOTS_PER_PROCESS + slot


def make_pool(
    *,
    workers: int | None = None,
    preload: tuple[str, ...] = (),
    site_packages: tuple[str, ...] = (),
    python: str | None = None,
    unsafe: bool = False,
    recycle_after: int = 500,
    limits: Limits | None = None,
    binds: tuple[tuple[str, str], ...] = (),
    network: str = "none",
    sessions: int = 32,
) -> WorkerPool:
    """Build the local pool, or refuse with what is missing when the host cannot isolate.

    ``binds``: (host dir, absolute jail path) pairs mounted read-only in every jail (a tool's install, a directory
    holding a unix socket the jail may connect to). ``network``: "none" (no sockets but AF_UNIX) or "loopback" (TCP
    and UDP inside the jail's own network namespace, which has a loopback device and nothing else: its programs can
    talk to each other, never to the host or beyond; a forwarder on loopback to a bound unix socket is how a jailed
    client reaches one host service). ``sessions``: persistent sessions the pool holds open at once (a jail each;
    an RL batch of tool episodes wants one per episode in flight).
    """
    if not 1 <= sessions <= SLOTS_PER_PROCESS - 1:
        raise ValueError(f"sessions={sessions!r}: a pool holds 1 to {SLOTS_PER_PROCESS - 1} persistent sessions")
    report = probe.probe(docker=False)
    missing = report.local_missing
    isolate = not missing
    if missing and not unsafe:
        raise SandboxUnavailable(
            "the local sandbox cannot isolate code on this host: "
            + "; ".join(missing)
            + ". Fix that, use another provider, or pass unsafe=True for rlimits-only subprocess workers (not a security boundary)."
        )
    python = python or default_python()
    if not os.access(python, os.X_OK):
        raise SandboxUnavailable(f"python={python!r} is not an executable interpreter")
    if report.root and not _world_reachable(python):
        raise SandboxUnavailable(
            f"python={python!r} is not reachable by the jails' unprivileged uids (a parent directory is not "
            "world-searchable); install Debian's python3 (apt-get install python3) or pass python=<a world-readable interpreter>"
        )
    for path in site_packages:
        if not os.path.isdir(path):
            raise ValueError(f"site_packages entry {path!r} is not a directory")
    binds = tuple(tuple(pair) for pair in binds)
    for pair in binds:
        if len(pair) != 2 or not os.path.isdir(pair[0]) or not str(pair[1]).startswith("/") or ".." in pair[1]:
            raise ValueError(f"binds entry {pair!r} must be (an existing host directory, an absolute jail path)")
    if network not in jail.NETWORKS:
        raise ValueError(f"network={network!r}; choose one of {', '.join(jail.NETWORKS)}")
    if network != "none" and not isolate:
        raise SandboxUnavailable(
            f"network={network!r} needs the jail's own network namespace, which this host cannot give: "
            + "; ".join(missing)
        )
    limits = limits or Limits()
    use_cgroups = report.root and report.cgroup_writable
    use_uids = report.root
    tag = owner.tag()
    group = f"{CGROUP_PREFIX}{tag}"
    reap()  # what runs killed by SIGKILL left behind

    def factory(_pool_slot: int, persistent: bool) -> JailWorker:
        slot = _SLOT_NUMBERS.take()  # the pool's own slot ids repeat across pools: never key a uid or cgroup by them
        uid = slot_uid(slot) if use_uids else None
        cgroup, scratch = None, None
        try:
            if use_cgroups:
                cgroup = SlotCgroup.create(
                    group,
                    f"slot{slot}",
                    uid if uid is not None else os.getuid(),
                    pids=limits.processes + 8,
                    memory_mb=limits.memory_mb + limits.cgroup_headroom_mb,
                )
            config = jail.zygote_config(
                list(preload), list(site_packages), persistent, pid_namespace=isolate, network=network
            )
            if not isolate:  # no private /tmp: give the worker a scratch dir of its own, never the host's /tmp
                scratch = tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{tag}-{slot}-")
                if uid is not None:
                    os.chown(scratch, uid, uid)
                config.update(scratch=[scratch], landlock=report.landlock_abi > 0, seccomp=report.seccomp)
            worker = JailWorker(
                python=python,
                config=config,
                site_dirs=list(site_packages),
                binds=list(binds),
                uid=uid,
                cgroup=cgroup,
                isolate=isolate,
            )
        except BaseException:
            if cgroup is not None:
                cgroup.remove()
            if scratch:
                shutil.rmtree(scratch, ignore_errors=True)
            _SLOT_NUMBERS.give(slot)
            raise
        worker.scratch = scratch
        worker.on_closed = lambda: _SLOT_NUMBERS.give(slot)  # once its processes are gone and its cgroup removed
        return worker

    size = workers or os.cpu_count() or 1
    if size + sessions > SLOTS_PER_PROCESS:
        raise ValueError(f"workers={size} and sessions={sessions}: at most {SLOTS_PER_PROCESS} jails per process")
    kind = "local" if isolate else "local-unsafe"
    return WorkerPool(kind, factory, size, recycle_after=recycle_after, max_sessions=sessions)


def stale_scratch_dirs() -> list[str]:
    """The unsafe workers' scratch dirs (in the temp dir) whose owner is gone."""
    base = tempfile.gettempdir()
    found = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(base):
            if entry.name.startswith(SCRATCH_PREFIX) and entry.is_dir(follow_symlinks=False):
                fields = entry.name[len(SCRATCH_PREFIX) :].split("-")
                tagged = len(fields) == 5 and all(field.isdigit() for field in fields[:4])
                if owner.gone("-".join(fields[:3]) if tagged else fields[0]):  # else: an older name, with the bare pid
                    found.append(entry.path)
    return found


def reap() -> dict[str, int]:
    """Remove what local pools of dead processes left on this host: their cgroups (killing whatever is still in one)
    and unsafe scratch dirs. Their processes need no reaping: each jail's launcher dies with the process that
    started it (PR_SET_PDEATHSIG) and takes its jail down with it. Run by every local pool's start.

    Returns:
        How many of each were removed: {"cgroups": n, "scratch dirs": m}.
    """
    removed = {"cgroups": 0, "scratch dirs": 0}
    if os.geteuid() == 0 and cgroups.version() is not None:
        removed["cgroups"] = cgroups.reap_stale(CGROUP_PREFIX)
    for path in stale_scratch_dirs():
        shutil.rmtree(path, ignore_errors=True)
        removed["scratch dirs"] += not os.path.exists(path)
    return removed


class LocalBackend(PoolBackend):
    """`sandboxes.open("local", ...)`: a shared pool of jailed workers on this host."""

    def __init__(self, *, unsafe: bool = False, limits: Limits | None = None, **options: object) -> None:
        super().__init__(make_pool(unsafe=unsafe, limits=limits, **options))
