"""Process reaping: after each execution every other process the jail holds is killed and reaped, so nothing a
snippet started (a `setsid` grandchild, a fork bomb's leftovers) outlives its call.

In a PID namespace of the jail's own (bubblewrap, where the zygote's parent is PID 1) that is everything but PID 1
and the zygote, one `kill(-1)`; without one (the unsafe subprocess mode) the zygote's descendants, found in /proc.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time


def kill_all(pid: int, own_namespace: bool) -> None:
    """Kill the child and everything else it may have started, without reaping (the caller waits)."""
    kill(pid)
    if own_namespace:
        kill(-1)
    else:
        for other in descendants(os.getpid()):
            kill(other)


def sweep(own_namespace: bool, spare: tuple[int, ...] = ()) -> bool:
    """SIGKILL every process this worker started except `spare`; reap them. In a PID namespace of
    our own that is everything but PID 1 and us (one kill(-1)); without one, our descendants.
    False when some are still there after 3 s (the worker is then replaced)."""
    me = os.getpid()
    if own_namespace and not spare:
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            return True  # no other process, not even an unreaped one, is left in the namespace
        except PermissionError:
            pass
    deadline = time.monotonic() + 3.0
    while True:
        others = [p for p in (jail_pids() if own_namespace else descendants(me)) if p not in (1, me, *spare)]
        if not others:
            return True
        if own_namespace and not spare:
            kill(-1)
        else:
            for p in others:
                kill(p)
        _reap(spare)
        if time.monotonic() > deadline:
            return False
        time.sleep(0.0005)


def jail_pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid in jail_pids():
        try:
            with open(f"/proc/{pid}/stat", "rb") as handle:
                ppid = int(handle.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(pid)
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)


def _reap(spare: tuple[int, ...]) -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pid in spare:  # the REPL died on its own; nothing else to do here
            continue
