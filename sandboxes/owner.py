"""Owner tags: what names the process that left something on the host (a cgroup, a scratch dir, a container).

A tag is ``<pid>-<start>-<pidns>``: the owner's pid, its start time (clock ticks since boot, /proc/PID/stat field 22)
and its pid namespace's inode. A reused pid has another start time, so its new process is never mistaken for the
owner; a tag of another pid namespace is never judged (its pids mean nothing here). Whatever a run leaves behind
when it dies by SIGKILL is found by its tag and removed by the next run (``sandboxes.reap()``). Stdlib only.
"""

from __future__ import annotations

import os
from functools import cache


def start_ticks(pid: int) -> int | None:
    """When process `pid` started (clock ticks since boot), or None if there is none (or only its zombie)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] in (b"Z", b"X"):  # dead, not yet reaped: it owns nothing any more
        return None
    return int(fields[19])


@cache
def _pid_namespace() -> int:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def tag(pid: int | None = None) -> str:
    """This process's owner tag (or that of live process `pid`)."""
    pid = os.getpid() if pid is None else pid
    return f"{pid}-{start_ticks(pid) or 0}-{_pid_namespace()}"


def gone(owner: str) -> bool:
    """Whether the process that `owner` (a tag, or a bare pid as older versions wrote) names is certainly dead.

    False for anything else: a live owner, another pid namespace's tag, a string that is no tag.
    """
    parts = owner.split("-")
    if not parts or not all(part.isdigit() for part in parts):
        return False
    if len(parts) == 1:  # a bare pid (before tags had a start time): a reused pid keeps it alive
        return start_ticks(int(parts[0])) is None
    if len(parts) != 3 or int(parts[2]) != _pid_namespace():
        return False
    return start_ticks(int(parts[0])) != int(parts[1])
