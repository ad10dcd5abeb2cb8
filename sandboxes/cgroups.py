"""Per-slot cgroups (v1 pids+memory+cpu, or v2) nested under the caller's own cgroup, so a limit
placed on the caller (e.g. by a test harness) also bounds every jail it starts."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time

from sandboxes import owner

ROOT = "/sys/fs/cgroup"
# No cpu controller: a nested cpu group would give all of a pool's jails the scheduling weight of a
# single task against everything else on the host. CPU is bounded per process by RLIMIT_CPU and per
# call by the wall-clock deadline instead.
V1_CONTROLLERS = ("pids", "memory")


def version() -> str | None:
    """ "v2" when the unified hierarchy is mounted at the root with pids+memory, "v1" when the v1
    pids and memory hierarchies exist, else None."""
    try:
        with open(os.path.join(ROOT, "cgroup.controllers")) as handle:
            if {"pids", "memory"} <= set(handle.read().split()):
                return "v2"
    except OSError:
        pass
    if all(os.path.isdir(os.path.join(ROOT, c)) for c in ("pids", "memory")):
        return "v1"
    return None


def _own_path(controller: str | None) -> str:
    """Our cgroup path inside the hierarchy of `controller` (None = v2 unified)."""
    with open("/proc/self/cgroup") as handle:
        for line in handle:
            _, names, path = line.rstrip("\n").split(":", 2)
            if (controller is None and names == "") or (controller is not None and controller in names.split(",")):
                return path
    return "/"


def writable() -> bool:
    kind = version()
    if kind is None:
        return False
    base = _base_dirs(kind)
    return all(os.access(d, os.W_OK) for d in base.values())


def _base_dirs(kind: str) -> dict[str, str]:
    if kind == "v2":
        return {"unified": os.path.join(ROOT, _own_path(None).lstrip("/"))}
    dirs = {}
    for controller in V1_CONTROLLERS:
        top = os.path.join(ROOT, controller)
        if os.path.isdir(top):
            dirs[controller] = os.path.join(top, _own_path(controller).lstrip("/"))
    return dirs


class SlotCgroup:
    """One jail's cgroup: pids.max and a memory cap (which also counts its tmpfs pages)."""

    def __init__(self, kind: str, dirs: dict[str, str]) -> None:
        self.kind = kind
        self.dirs = dirs
        self._memory_bytes = 0
        self._oom_fd: int | None = None  # kept open: re-read with pread, one syscall per call

    @classmethod
    def create(cls, group: str, slot: str, uid: int, pids: int, memory_mb: int) -> SlotCgroup:
        kind = version()
        if kind is None:
            raise OSError("no cgroup hierarchy with pids and memory controllers")
        dirs = {}
        for controller, base in _base_dirs(kind).items():
            path = os.path.join(base, group, slot)
            os.makedirs(path, exist_ok=True)
            os.chown(os.path.join(path, "cgroup.procs"), uid, -1)
            dirs[controller] = path
        cgroup = cls(kind, dirs)
        cgroup._write("pids", "pids.max", str(pids))
        cgroup.set_memory_mb(memory_mb)
        return cgroup

    def _path(self, controller: str, name: str) -> str:
        return os.path.join(self.dirs["unified" if self.kind == "v2" else controller], name)

    def _write(self, controller: str, name: str, value: str) -> None:
        with open(self._path(controller, name), "w") as handle:
            handle.write(value)

    def set_memory_mb(self, memory_mb: int) -> None:
        wanted = memory_mb * 1024 * 1024
        if wanted == self._memory_bytes:
            return
        name = "memory.max" if self.kind == "v2" else "memory.limit_in_bytes"
        try:
            self._write("memory", name, str(wanted))
            self._memory_bytes = wanted
        except OSError:  # lowering below current usage fails; keep the old (larger) cap
            pass

    def procs_files(self) -> list[str]:
        return [os.path.join(d, "cgroup.procs") for d in self.dirs.values()]

    def pids(self) -> list[int]:
        found: set[int] = set()
        for path in self.procs_files():
            try:
                with open(path) as handle:
                    found.update(int(line) for line in handle if line.strip())
            except OSError:
                continue
        return sorted(found)

    def oom_kills(self) -> int:
        name, key = ("memory.events", b"oom_kill") if self.kind == "v2" else ("memory.oom_control", b"oom_kill")
        try:
            if self._oom_fd is None:
                self._oom_fd = os.open(self._path("memory", name), os.O_RDONLY)
            text = os.pread(self._oom_fd, 4096, 0)
        except (OSError, KeyError):
            return 0
        for line in text.splitlines():
            field, _, value = line.partition(b" ")
            if field == key:
                return int(value)
        return 0

    def memory_mb_differs(self, memory_mb: int) -> bool:
        """Whether set_memory_mb(memory_mb) would write (a write can reclaim memory, i.e. block)."""
        return memory_mb * 1024 * 1024 != self._memory_bytes

    def kill_all(self, timeout_s: float = 3.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while True:
            pids = self.pids()
            if not pids:
                return True
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)

    def remove(self) -> None:
        self.kill_all()
        if self._oom_fd is not None:
            os.close(self._oom_fd)
            self._oom_fd = None
        for path in self.dirs.values():
            _rmdir_retry(path)
            _rmdir_if_empty(os.path.dirname(path))


def _rmdir_retry(path: str) -> None:
    for _ in range(100):
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY:  # not ours to remove (EACCES), or not empty of sub-groups: retrying won't help
                return
            time.sleep(0.01)


def _rmdir_if_empty(path: str) -> None:
    try:
        if not any(entry.is_dir() for entry in os.scandir(path)):
            os.rmdir(path)
    except OSError:
        pass


def _tops(kind: str) -> list[str]:
    """The roots of the hierarchies our slot cgroups live in."""
    if kind == "v2":
        return [ROOT]
    return [path for path in (os.path.join(ROOT, c) for c in V1_CONTROLLERS) if os.path.isdir(path)]


def stale_groups(prefix: str) -> list[str]:
    """The `<prefix><owner tag>` group dirs, anywhere in the hierarchy, whose owner is gone (see `sandboxes.owner`)."""
    kind = version()
    found = []
    for top in _tops(kind) if kind else []:
        for root, dirs, _ in os.walk(top):
            keep = []
            for name in dirs:
                if not name.startswith(prefix):
                    keep.append(name)
                elif owner.gone(name[len(prefix) :]):
                    found.append(os.path.join(root, name))
            dirs[:] = keep  # never descend into a group of ours (its slots are no groups)
    return found


def reap_stale(prefix: str) -> int:
    """Remove the `<prefix><owner tag>` group dirs of dead owners, killing anything still inside. Returns the count.

    The whole hierarchy is searched, not only our own cgroup: a run killed by SIGKILL cannot remove its groups (its
    launchers die with it, but a cgroup outlives its last process), and the next run may be placed in another cgroup.
    A tag of another pid namespace is never judged, so its groups are left alone.
    """
    kind = version()
    if kind is None:
        return 0
    removed = 0
    for path in stale_groups(prefix):
        with contextlib.suppress(OSError):
            for slot in os.scandir(path):
                if slot.is_dir():
                    SlotCgroup(kind, {"x": slot.path}).kill_all()
                    _rmdir_retry(slot.path)
        _rmdir_retry(path)
        removed += not os.path.isdir(path)
    return removed
