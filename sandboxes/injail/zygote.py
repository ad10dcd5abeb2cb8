"""The warm worker that runs inside one jail, and its server loop: preloads modules, hardens itself once, then
hands each request to a pre-forked child and cleans up after it.

Run as `python -I -S zygote.py '<json config>'` with the request channel on fds 0/1. Stdlib-only and
self-contained apart from its sibling in-jail modules (this directory, put first on `sys.path`):

- `spare.py`: the child forked while idle that reads and runs the next request; `child.py`: what every child
  does to become `python -c` (stdio, rlimits, running the code);
- `capture.py`: the child's output into memfds, replied in one sendfile; `outcome.py`: the status it earns;
- `reaper.py`: killing and reaping everything else in the jail; `workdir.py`: path-guarded files and the wipe;
- `repl.py`: the persistent session's long-lived child; `frames.py`, `bpf_filter.py`, `landlock.py`: the wire
  format and the two kernel restrictions.

Per request a *spare* child, forked while the worker was idle, reads the request payload
straight from the channel, applies rlimits and runs the code. The zygote itself never reads the
payload nor the output into its own memory (output is spliced into memfds and sendfile'd back), so
nothing of one execution survives in the zygote for a later fork to find. It stops on the child's
"done" message or its *exit* (pidfd), never on pipe EOF (a setsid grandchild can hold the pipe),
replies, then kills every other process in the jail's PID namespace, reaps them, wipes the scratch
dirs and forks the next spare. In REPL mode one long-lived child keeps its globals across requests.

Wire: request = header frame {"op", "limits", ...}; for "python"/"exec" a payload frame follows
({"code"|"argv", "stdin", "files"}), read by the spare. Reply = header frame with "stdout_len" and
"stderr_len", followed by that many raw bytes of each (for an execution all of it in one sendfile
from the stdout memfd, so the host wakes once).

Every page the zygote writes while a spare lives is a copy-on-write fault, and so is every page a spare writes:
the per-call path calls its helpers by plain global name (`from module import name`), and nothing here imports a
module or builds an object per call that the single-file zygote did not.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpf_filter  # noqa: E402
import frames  # noqa: E402
import landlock  # noqa: E402
import workdir  # noqa: E402
from capture import Capture  # noqa: E402
from child import libc, spare_stdio  # noqa: E402
from outcome import classify, oom_kills  # noqa: E402
from reaper import kill_all, sweep  # noqa: E402
from repl import Repl  # noqa: E402
from spare import Spare, first_line, rehearse  # noqa: E402
from workdir import make_work, wipe  # noqa: E402

PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER = 4, 36


class Zygote:
    """One jail's worker: `serve()` answers the host's requests on fds 0/1 until the host closes the channel."""

    def __init__(self, config: dict) -> None:
        self.config = config
        self.work = workdir.configure(config.get("scratch"))
        self.own_namespace = config.get("pid_namespace", True)
        self.pid = os.getpid()
        self.scope_fd: int | None = None
        self.repl: Repl | None = None
        self.spare: Spare | None = None
        # Every child's environment, set once here: spares inherit it (setting it per child costs
        # ~40 copy-on-write faults on the caller's clock).
        os.environ.clear()
        os.environ.update(config.get("env", {}))
        # Move the request channel off fds 0/1 so nothing printed here can corrupt it.
        self.rx = os.dup(0)
        self.tx = os.dup(1)
        null = os.open("/dev/null", os.O_RDWR)
        for fd in (0, 1):
            os.dup2(null, fd)
        os.close(null)
        self.stdio = spare_stdio()

    # ---- start-up -------------------------------------------------------------------------
    def harden(self) -> dict:
        report: dict = {"preloaded": [], "missing": []}
        for path in self.config.get("site", []):
            sys.path.append(path)
        for name in self.config.get("preload", []):
            try:
                __import__(name)
                report["preloaded"].append(name)
            except Exception as exc:  # a missing optional module is not fatal
                report["missing"].append(f"{name}: {type(exc).__name__}: {exc}")
        import _thread
        import atexit  # noqa: F401  (warm what every child uses)
        import traceback  # noqa: F401

        if self.config.get("persistent"):
            import ast  # noqa: F401  (the REPL parses every cell)

        # Not `threading`: once imported, its at-fork hook runs in every spare (~120 copy-on-write
        # faults per fork); a snippet that uses threads imports it itself.
        report["threads"] = _thread._count() + 1
        libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        version = landlock.abi() if self.config.get("landlock", True) else 0
        report["landlock_abi"] = version
        if self.config.get("seccomp", True):
            bpf_filter.install()  # also sets no_new_privs
            report["seccomp"] = True
        else:
            report["seccomp"] = False
        if version:
            fd = landlock.filesystem_ruleset(version, writable=list(workdir.SCRATCH), readable=["/"])
            for dev in ("/dev/null", "/dev/zero", "/dev/full", "/dev/urandom", "/dev/random"):
                landlock._allow(fd, dev, landlock.FS_READ_FILE | landlock.FS_WRITE_FILE)
            landlock.restrict_self(fd)
            os.close(fd)
            self.scope_fd = landlock.scope_ruleset(version)
        report["pid"] = os.getpid()
        # CPython 3.11 rewrites a function's bytecode as it warms up (quickening, specialization):
        # warmed here, the rehearsal's code is inherited ready instead of rewritten (copied) in every spare.
        for _ in range(10):
            rehearse()
        gc.freeze()  # children then never touch (copy) the preloaded objects' GC headers
        if hasattr(libc, "malloc_trim"):  # glibc: return the heap's free pages, fewer for each fork to copy
            libc.malloc_trim(0)
        return report

    def serve(self) -> None:
        frames.write_fd(self.tx, {"ready": True, **self.harden()})
        autonomous = not self.config.get("persistent")
        make_work()
        if autonomous:
            self.spare = Spare(self, autonomous=True)
        while True:
            if autonomous:  # the waiting spare reads the channel; we hear from it on its meta pipe
                spare, self.spare = self.spare, None
                capture = Capture(spare)  # made while idle: the "O" wake-up then only parses a line
                kind, request, rest = first_line(spare)
                if kind == b"O":
                    self.run(request, capture, rest)
                    continue
                capture.close()
                self.after(spare, reaped=False, loaded=kind == b"H")
                if kind != b"H":
                    return  # b"E": the host closed the channel
            else:
                try:
                    request = frames.read_fd(self.rx)
                except frames.FrameError:
                    return
            self.dispatch(request)

    def dispatch(self, request: dict) -> None:
        op = request.get("op")
        if op in ("python", "exec"):
            make_work()  # a persistent session's code may have removed it
            self.run(request, Capture(Spare(self)), b"")
            return
        if op == "repl":
            reply, out, err = self.run_repl(request)
            self.send(reply, out, err)
            return
        if op == "ping":
            reply = {"pong": True}
        elif op == "put":
            reply = workdir.put(request)
        elif op == "get":
            reply = workdir.get(request)
        else:
            reply = {"error": f"unknown op {op!r}"}
        frames.write_fd(self.tx, reply)

    def send(self, reply: dict, out: bytes, err: bytes) -> None:
        """Reply header, then stdout and stderr, in one write."""
        view = memoryview(frames.encode({**reply, "stdout_len": len(out), "stderr_len": len(err)}) + out + err)
        while view:
            view = view[os.write(self.tx, view) :]

    # ---- one-shot execution -----------------------------------------------------------------
    def run(self, request: dict, capture: Capture, meta: bytes) -> None:
        """Supervise `capture.spare` running `request` (its payload is read by the spare itself)."""
        limits = request["limits"]
        oom_before = oom_kills()  # visible in a container; the local host reads the jail's cgroup itself
        start = time.monotonic()
        spare = capture.spare
        if not spare.autonomous:
            frames.write_fd(spare.go_w, {"op": request["op"], "limits": limits})
        capture.cap = limits["max_output_bytes"]
        capture.meta = meta
        outcome, done = capture.pump(start + limits["wall_s"])
        reaped = None
        if outcome == "exited":
            reaped = os.wait4(spare.pid, 0)
        else:
            kill_all(spare.pid, self.own_namespace)
        capture.drain()
        if capture.truncated and outcome in ("exited", "done"):
            outcome = "output_limit"
        reply = classify(outcome, done, reaped, limits)
        if reply["status"] == "killed" and oom_kills() > oom_before:
            reply["status"] = "oom"
        loaded = capture.meta.startswith(b"L")
        if not loaded:  # the spare died before consuming its payload: the channel may be out of step
            reply.update(status="infra_error", note="the worker's spare process failed before reading the request")
        reply.update(truncated=capture.truncated, wall_ms=(time.monotonic() - start) * 1000, healthy=loaded)
        capture.send(self.tx, reply)
        capture.close()
        self.after(spare, reaped is not None, loaded)

    def after(self, spare: Spare, reaped: bool, loaded: bool) -> None:
        """Post-reply cleanup: reap, sweep, wipe, and fork the next spare while the host is busy."""
        if not reaped:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(spare.pid, 0)
        spare.close()
        keep = (self.repl.pid,) if self.repl is not None and self.repl.alive() else ()
        healthy = sweep(self.own_namespace, keep) and loaded
        if not self.config.get("persistent"):
            wipe()
            if healthy:
                self.spare = Spare(self, autonomous=True)
        if not healthy:
            os._exit(3)  # the host sees the worker die and replaces it

    # ---- persistent REPL ----------------------------------------------------------------------
    def run_repl(self, request: dict) -> tuple[dict, bytes, bytes]:
        if self.repl is not None and not self.repl.alive():
            self.repl.close()
            self.repl = None
        if self.repl is None:
            self.repl = Repl(self, request["limits"])
        workdir.put(request)
        reply = self.repl.run(request)
        out, err = bytes(self.repl.pipes.out), bytes(self.repl.pipes.err)
        spare = (self.repl.pid,) if self.repl.alive() else ()
        if not spare:
            self.repl = None
        reply["healthy"] = sweep(self.own_namespace, spare)
        return reply, out, err


if __name__ == "__main__":
    Zygote(json.loads(sys.argv[1])).serve()
