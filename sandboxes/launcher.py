"""The first process of every jail, outside it: `python -I -S launcher.py CGROUP_PROCS... -- ARGV...`.

It moves itself into the jail's cgroups (before anything of the jail runs), becomes a child
subreaper, starts ARGV (bwrap), and reaps every process that gets orphaned under it until none is
left: bwrap's PID 1 can outlive bwrap's monitor process by a moment, and a host init that does not
reap would otherwise collect zombies. SIGTERM kills everything below it (the jail, and any orphan
that escaped it) and reaps it all before exiting. Stdlib only; runs
as the jail's unprivileged uid.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time

PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 1, 36


def main(args: list[str]) -> int:
    split = args.index("--")
    for procs_file in args[:split]:
        with open(procs_file, "w") as handle:
            handle.write(str(os.getpid()))
    argv = args[split + 1 :]
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    host = os.getppid()
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    child = os.fork()
    if child == 0:
        os.execv(argv[0], argv)
    signal.signal(signal.SIGTERM, _terminate)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # the jail holds the channel now; EOF must follow the jail, not us
        os.dup2(null, fd)
    code = 1
    try:
        if os.getppid() != host:  # the host died before PDEATHSIG was armed
            raise _Terminate
        while True:
            try:
                pid, status = os.waitpid(-1, 0)
            except ChildProcessError:
                return code
            if pid == child:
                code = os.waitstatus_to_exitcode(status)
    except _Terminate:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # Terminating: everything below us (orphans are reparented to us, the subreaper) dies and is reaped.
    while True:
        for pid in _children():
            _kill(pid)
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return code
        if pid == 0:
            time.sleep(0.005)


class _Terminate(Exception):
    pass


def _terminate(*_: object) -> None:
    raise _Terminate


def _children() -> list[int]:
    me = os.getpid()
    with open(f"/proc/{me}/task/{me}/children") as handle:
        return [int(pid) for pid in handle.read().split()]


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
