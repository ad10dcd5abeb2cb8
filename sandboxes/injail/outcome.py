"""What an execution's status is ("ok", "error", "timeout", "cpu_limit", "oom", "output_limit", "killed"), from why
the capture stopped, the child's own "done" report and its wait status; and the container's OOM-kill counter.
"""

from __future__ import annotations

import os
import signal


def classify(outcome: str, done: dict | None, reaped, limits: dict) -> dict:
    """Status from why the pump stopped, the child's own "done" report, and its wait status."""
    exit_code = sig = cpu_ms = None
    if reaped is not None:
        _, wstatus, usage = reaped
        exit_code = os.WEXITSTATUS(wstatus) if os.WIFEXITED(wstatus) else None
        sig = os.WTERMSIG(wstatus) if os.WIFSIGNALED(wstatus) else None
        cpu_ms = (usage.ru_utime + usage.ru_stime) * 1000
    if done is not None:
        exit_code, sig = done["exit_code"], None
    if outcome in ("timeout", "output_limit"):
        status = outcome
    elif sig == signal.SIGXCPU or (
        sig == signal.SIGKILL and cpu_ms is not None and cpu_ms >= limits["cpu_s"] * 1000 - 50
    ):
        status = "cpu_limit"
    elif done is not None and done.get("memory_error"):
        status = "oom"
    elif sig is not None or exit_code is None:
        status = "killed"
    else:
        status = "ok" if exit_code == 0 else "error"
    return {"status": status, "exit_code": exit_code, "signal": sig, "cpu_ms": cpu_ms}


# A container's own cgroup OOM counter, when mounted (the local jails have no /sys: their host reads the cgroup).
_OOM_EVENTS = [
    p for p in ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control") if os.path.exists(p)
]


def oom_kills() -> int:
    """How many processes the kernel's OOM killer took in this container so far (0 where nothing says)."""
    for path in _OOM_EVENTS:
        try:
            with open(path) as handle:
                for line in handle:
                    name, _, value = line.partition(" ")
                    if name == "oom_kill":
                        return int(value)
        except OSError:
            continue
    return 0
