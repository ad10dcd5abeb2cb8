"""The warm worker that runs inside one jail: preloads modules, hardens itself once, then forks
one child per request and cleans up after it.

Run as `python -I -S zygote.py '<json config>'` with the request channel on fds 0/1. Stdlib-only and
self-contained apart from its sibling in-jail modules (frames, bpf_filter, landlock).

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
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import errno
import fcntl
import gc
import json
import math
import os
import resource
import select
import signal
import stat
import sys
import time
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpf_filter  # noqa: E402
import frames  # noqa: E402
import landlock  # noqa: E402

WORK = "/tmp/work"
SCRATCH = ("/tmp", "/dev/shm")
_libc = ctypes.CDLL(None, use_errno=True)
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER = 1, 4, 36
SIGKILL = int(signal.SIGKILL)  # a plain int: using the enum member writes to its pages in every child
# A spare rehearses (see `_rehearse`) only when no request came for this long: under steady traffic
# the next request is due any moment and the rehearsal would only compete with it for the cores.
REHEARSE_AFTER_S = 0.002
GET_MAX_BYTES = 48 << 20  # a download's bytes, base64-encoded, must fit in one frame (frames.MAX_FRAME_BYTES)


class Spare:
    """A pre-forked child waiting for its request. `autonomous`: it rehearses an execution (see
    `_rehearse`) once no request came for REHEARSE_AFTER_S, then reads the request itself and tells
    the zygote ("O" line with the limits it enforces on its meta pipe, followed by "L", in one write
    once the payload is in), saving a hand-off; otherwise the zygote reads the header and passes it
    on the go pipe (persistent sessions, whose zygote also serves REPL and file requests)."""

    def __init__(self, zygote: Zygote, autonomous: bool = False) -> None:
        self.autonomous = autonomous
        self.out_r, self.out_w = os.pipe()
        self.err_r, self.err_w = os.pipe()
        self.meta_r, self.meta_w = os.pipe()
        ours, theirs = [self.out_r, self.err_r, self.meta_r], [self.out_w, self.err_w, self.meta_w]
        if not autonomous:  # the go pipe: only a spare that does not read its own request needs one
            self.go_r, self.go_w = os.pipe()
            ours.append(self.go_w)
            theirs.append(self.go_r)
        self.pid = os.fork()
        if self.pid == 0:
            self._main(zygote, ours)
        for fd in theirs:
            os.close(fd)
        self.pidfd = os.pidfd_open(self.pid)
        self.fds = (*ours, self.pidfd)

    def close(self) -> None:
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)

    def _main(self, zygote: Zygote, parent_ends: list[int]) -> None:
        try:
            for fd in parent_ends:
                os.close(fd)
            _die_with(zygote.pid)
            os.setsid()
            if zygote.scope_fd is not None:
                landlock.restrict_self(zygote.scope_fd)
            # The child's stdio, set up before the request: stdin an empty memfd (the payload's
            # bytes go in later), stdout/stderr the capture pipes.
            memfd = os.memfd_create("stdin", 0)
            for src, dst in ((memfd, 0), (self.out_w, 1), (self.err_w, 2)):
                os.dup2(src, dst)
            os.close(memfd)
            namespace = _take_stdio(zygote.stdio)
            if self.autonomous:
                if not select.select([zygote.rx], [], [], REHEARSE_AFTER_S)[0]:  # the worker is idle
                    _rehearse()
                try:
                    header = frames.read_body_fd(zygote.rx)
                    order = frames.decode_body(header)
                except frames.FrameError:
                    os.write(self.meta_w, b"E\n")  # the host closed the channel
                    os._exit(0)
                if order.get("op") not in ("python", "exec"):  # not ours: hand it to the zygote
                    # on one line: a raw newline can only be whitespace between tokens (strict JSON)
                    os.write(self.meta_w, b"H" + header.replace(b"\n", b"") + b"\n")
                    os._exit(0)
            else:
                try:
                    order = frames.read_fd(self.go_r)  # this request's op and limits
                except frames.FrameError:
                    os._exit(0)
            payload = frames.read_fd(zygote.rx)
            _write_files(payload.get("files", {}))
            stdin = payload.get("stdin")
            if stdin:
                os.write(0, base64.b64decode(stdin))
                os.lseek(0, 0, os.SEEK_SET)
            loaded = b"L"  # the payload is consumed: the channel is in step for the next request
            if self.autonomous:  # one write, one wake-up of the zygote, which needs no JSON to read it
                limits = order["limits"]
                numbers = (float(limits["wall_s"]), limits["max_output_bytes"], float(limits["cpu_s"]))
                loaded = b"O%r %d %r\nL" % numbers
            os.write(self.meta_w, loaded)
            os.dup2(self.meta_w, 3)
            os.closerange(4, 1 << 16)
            _apply_limits(order["limits"])
            os.chdir(WORK)
            if order["op"] == "exec":
                os.set_inheritable(3, False)
                signal.signal(signal.SIGPIPE, signal.SIG_DFL)
                argv = payload["argv"]
                try:
                    os.execvp(argv[0], argv)
                except OSError as exc:
                    os.write(2, f"sandbox: cannot execute {argv[0]!r}: {exc.strerror}\n".encode())
                    os._exit(127)
            exit_code, memory_error = _child_python(payload["code"], namespace)
            os.write(3, b"D%d %d\n" % (exit_code, memory_error))
            os._exit(exit_code)
        except BaseException:
            os._exit(126)


class Zygote:
    def __init__(self, config: dict) -> None:
        global WORK, SCRATCH
        self.config = config
        SCRATCH = tuple(config.get("scratch", SCRATCH))
        WORK = os.path.join(SCRATCH[0], "work")
        self.pid = os.getpid()
        # what the wipe restores: the jail's uid owns these mounts, so a snippet can chmod them or tag them
        self.scratch_modes = {top: os.stat(top).st_mode & 0o7777 for top in SCRATCH if os.path.isdir(top)}
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
        self.stdio = _spare_stdio()

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
        _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
        _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        version = landlock.abi() if self.config.get("landlock", True) else 0
        report["landlock_abi"] = version
        if self.config.get("seccomp", True):
            bpf_filter.install()  # also sets no_new_privs
            report["seccomp"] = True
        else:
            report["seccomp"] = False
        if version:
            fd = landlock.filesystem_ruleset(version, writable=list(SCRATCH), readable=["/"])
            for dev in ("/dev/null", "/dev/zero", "/dev/full", "/dev/urandom", "/dev/random"):
                landlock._allow(fd, dev, landlock.FS_READ_FILE | landlock.FS_WRITE_FILE)
            landlock.restrict_self(fd)
            os.close(fd)
            self.scope_fd = landlock.scope_ruleset(version)
        report["pid"] = os.getpid()
        # CPython 3.11 rewrites a function's bytecode as it warms up (quickening, specialization):
        # warmed here, the rehearsal's code is inherited ready instead of rewritten (copied) in every spare.
        for _ in range(10):
            _rehearse()
        gc.freeze()  # children then never touch (copy) the preloaded objects' GC headers
        if hasattr(_libc, "malloc_trim"):  # glibc: return the heap's free pages, fewer for each fork to copy
            _libc.malloc_trim(0)
        return report

    def serve(self) -> None:
        frames.write_fd(self.tx, {"ready": True, **self.harden()})
        autonomous = not self.config.get("persistent")
        _make_work()
        if autonomous:
            self.spare = Spare(self, autonomous=True)
        while True:
            if autonomous:  # the waiting spare reads the channel; we hear from it on its meta pipe
                spare, self.spare = self.spare, None
                capture = _Capture(spare)  # made while idle: the "O" wake-up then only parses a line
                kind, request, rest = _first_line(spare)
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
            _make_work()  # a persistent session's code may have removed it
            self.run(request, _Capture(Spare(self)), b"")
            return
        if op == "repl":
            reply, out, err = self.run_repl(request)
            self.send(reply, out, err)
            return
        if op == "ping":
            reply = {"pong": True}
        elif op == "put":
            reply = self.put(request)
        elif op == "get":
            reply = self.get(request)
        else:
            reply = {"error": f"unknown op {op!r}"}
        frames.write_fd(self.tx, reply)

    def send(self, reply: dict, out: bytes, err: bytes) -> None:
        """Reply header, then stdout and stderr, in one write."""
        view = memoryview(frames.encode({**reply, "stdout_len": len(out), "stderr_len": len(err)}) + out + err)
        while view:
            view = view[os.write(self.tx, view) :]

    def send_capture(self, reply: dict, capture: _Capture) -> None:
        """Reply header, stdout and stderr in one sendfile from the stdout memfd (the host wakes once),
        the output never entering our memory: the header goes in front of stdout, stderr after it."""
        out, err = capture.sizes
        header = frames.encode({**reply, "stdout_len": out, "stderr_len": err})
        start, end = _Capture.HEAD - len(header), _Capture.HEAD + out
        if start < 0:  # our replies are far smaller
            raise frames.FrameError(f"reply header of {len(header)} bytes")
        os.pwrite(capture.out, header, start)
        copied = 0
        while copied < err:
            step = os.copy_file_range(capture.err, capture.out, err - copied, copied, end + copied)
            if step == 0:
                raise OSError("copy_file_range made no progress")
            copied += step
        end += err
        while start < end:
            sent = os.sendfile(self.tx, capture.out, start, end - start)
            if sent == 0:
                raise OSError("sendfile made no progress")
            start += sent

    # ---- files ----------------------------------------------------------------------------
    # A persistent session's earlier code may have planted symlinks, FIFOs or directories at these paths: the
    # zygote follows no symlink (`_open_in_work`), touches regular files only, and answers an error, never dies.
    def put(self, request: dict) -> dict:
        _make_work()
        try:
            _write_files(request.get("files", {}))
        except (OSError, ValueError) as exc:
            return {"error": f"cannot write {sorted(request.get('files', {}))}: {exc}"}
        return {"ok": True}

    def get(self, request: dict) -> dict:
        limit = min(request.get("max_bytes", GET_MAX_BYTES), GET_MAX_BYTES)
        try:
            with os.fdopen(_open_in_work(request["path"], os.O_RDONLY), "rb") as handle:
                data = handle.read(limit + 1)
        except (OSError, ValueError) as exc:
            return {"error": f"cannot read {request['path']!r}: {exc}"}
        if len(data) > limit:
            return {"error": f"{request['path']!r} is larger than {limit} bytes, the most one download carries"}
        return {"data": base64.b64encode(data).decode()}

    # ---- one-shot execution -----------------------------------------------------------------
    def run(self, request: dict, capture: _Capture, meta: bytes) -> None:
        """Supervise `capture.spare` running `request` (its payload is read by the spare itself)."""
        limits = request["limits"]
        oom_before = _oom_kills()  # visible in a container; the local host reads the jail's cgroup itself
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
            self.kill_all(spare.pid)
        capture.drain()
        if capture.truncated and outcome in ("exited", "done"):
            outcome = "output_limit"
        reply = _classify(outcome, done, reaped, limits)
        if reply["status"] == "killed" and _oom_kills() > oom_before:
            reply["status"] = "oom"
        loaded = capture.meta.startswith(b"L")
        if not loaded:  # the spare died before consuming its payload: the channel may be out of step
            reply.update(status="infra_error", note="the worker's spare process failed before reading the request")
        reply.update(truncated=capture.truncated, wall_ms=(time.monotonic() - start) * 1000, healthy=loaded)
        self.send_capture(reply, capture)
        capture.close()
        self.after(spare, reaped is not None, loaded)

    def after(self, spare: Spare, reaped: bool, loaded: bool) -> None:
        """Post-reply cleanup: reap, sweep, wipe, and fork the next spare while the host is busy."""
        if not reaped:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(spare.pid, 0)
        spare.close()
        keep = (self.repl.pid,) if self.repl is not None and self.repl.alive() else ()
        healthy = self.sweep(keep) and loaded
        if not self.config.get("persistent"):
            self.wipe()
            if healthy:
                self.spare = Spare(self, autonomous=True)
        if not healthy:
            os._exit(3)  # the host sees the worker die and replaces it

    def kill_all(self, pid: int) -> None:
        """Kill the child and everything else it may have started, without reaping (the caller waits)."""
        _kill(pid)
        if self.config.get("pid_namespace", True):
            _kill(-1)
        else:
            for other in _descendants(os.getpid()):
                _kill(other)

    def sweep(self, spare: tuple[int, ...] = ()) -> bool:
        """SIGKILL every process this worker started except `spare`; reap them. In a PID namespace of
        our own that is everything but PID 1 and us (one kill(-1)); without one, our descendants."""
        me = os.getpid()
        own_namespace = self.config.get("pid_namespace", True)
        if own_namespace and not spare:
            try:
                os.kill(-1, signal.SIGKILL)
            except ProcessLookupError:
                return True  # no other process, not even an unreaped one, is left in the namespace
            except PermissionError:
                pass
        deadline = time.monotonic() + 3.0
        while True:
            others = [p for p in (_jail_pids() if own_namespace else _descendants(me)) if p not in (1, me, *spare)]
            if not others:
                return True
            if own_namespace and not spare:
                _kill(-1)
            else:
                for p in others:
                    _kill(p)
            _reap(spare)
            if time.monotonic() > deadline:
                return False
            time.sleep(0.0005)

    def wipe(self) -> None:
        for top, mode in self.scratch_modes.items():
            with contextlib.suppress(OSError):  # where the jail's uid owns the mount (not in a container)
                os.chmod(top, mode)  # first: a read-only /tmp would keep its entries
                for name in os.listxattr(top):
                    os.removexattr(top, name)
        for top in SCRATCH:
            try:
                entries = list(os.scandir(top))  # no os.path calls per entry: fewer pages written each run
            except OSError:
                continue
            for entry in entries:  # the work dir too: its mode, times or xattrs must not reach the next run
                try:
                    os.rmdir(entry.path)  # an empty directory (the work dir, usually): one system call
                except OSError:
                    _remove(entry.path)
        _make_work()

    # ---- persistent REPL ----------------------------------------------------------------------
    def run_repl(self, request: dict) -> tuple[dict, bytes, bytes]:
        if self.repl is not None and not self.repl.alive():
            self.repl.close()
            self.repl = None
        if self.repl is None:
            self.repl = Repl(self, request["limits"])
        self.put(request)
        reply = self.repl.run(request)
        out, err = bytes(self.repl.pipes.out), bytes(self.repl.pipes.err)
        spare = (self.repl.pid,) if self.repl.alive() else ()
        if not spare:
            self.repl = None
        reply["healthy"] = self.sweep(spare)
        return reply, out, err


class Repl:
    """A child that keeps its globals between cells. A cell that times out or crashes ends it."""

    def __init__(self, zygote: Zygote, limits: dict) -> None:
        self.to_repl_r, self.to_repl_w = os.pipe()
        self.from_repl_r, self.from_repl_w = os.pipe()
        self.pipes = _Pipes()
        os.makedirs(WORK, exist_ok=True)
        self.pid = os.fork()
        if self.pid == 0:
            try:
                _die_with(zygote.pid)
                os.setsid()
                if zygote.scope_fd is not None:
                    landlock.restrict_self(zygote.scope_fd)
                rx = fcntl.fcntl(self.to_repl_r, fcntl.F_DUPFD, 100)
                tx = fcntl.fcntl(self.from_repl_w, fcntl.F_DUPFD, 100)
                self.pipes.become_child()
                os.dup2(rx, 5)
                os.dup2(tx, 6)
                os.closerange(3, 5)  # the zygote's own channel to the host: never in reach of a cell's code
                os.closerange(7, 1 << 16)
                _apply_limits(limits, cpu_limit=False)  # per cell instead, see _repl_loop
                os.chdir(WORK)
                _repl_loop(5, 6, zygote.stdio)
            except BaseException:
                _print_exception()
            finally:
                os._exit(126)
        self.pipes.close_child_ends()
        os.close(self.to_repl_r)
        os.close(self.from_repl_w)

    def alive(self) -> bool:
        try:
            return self.pid > 0 and os.waitpid(self.pid, os.WNOHANG) == (0, 0)
        except ChildProcessError:
            return False

    def close(self) -> None:
        self.pipes.close()
        for fd in (self.to_repl_w, self.from_repl_r):
            os.close(fd)

    def run(self, request: dict) -> dict:
        limits = request["limits"]
        start = time.monotonic()
        self.pipes.out, self.pipes.err, self.pipes.truncated = bytearray(), bytearray(), False
        frames.write_fd(self.to_repl_w, {"code": request["code"], "cpu_s": limits["cpu_s"]})
        outcome = self.pipes.pump(
            self.pid,
            start + limits["wall_s"],
            limits["max_output_bytes"],
            done_fd=self.from_repl_r,
            on_kill=lambda: _kill(self.pid),
        )
        cell = None
        if outcome == "done":
            try:
                cell = frames.read_fd(self.from_repl_r)
            except frames.FrameError:  # the REPL closed its end: it is exiting
                outcome = "exited"
            # the cell's own code can write this pipe: anything but the loop's report ends the REPL
            if cell is not None and not (
                type(cell.get("exit_code")) is int
                and 0 <= cell["exit_code"] <= 255
                and type(cell.get("memory_error")) is bool
                and len(cell) == 2
            ):
                cell, outcome = None, "exited"
        if cell is not None:
            reply = _classify("done", cell, None, limits)
        else:
            _kill(self.pid)
            try:
                reaped = os.wait4(self.pid, 0)
            except ChildProcessError:  # already reaped by a sweep
                reaped = None
            self.pid = -1
            self.close()
            reply = _classify(outcome, None, reaped, limits)
            self.pipes.err += b"\n[sandbox] the REPL process ended; its state was lost\n"
            reply["repl_reset"] = True
        reply.update(truncated=self.pipes.truncated, wall_ms=(time.monotonic() - start) * 1000)
        return reply


def _repl_loop(rx: int, tx: int, stdio: tuple) -> None:
    import ast

    namespace = _take_stdio(stdio)
    while True:
        try:
            cell = frames.read_fd(rx)
        except frames.FrameError:
            os._exit(0)
        used = sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
        soft = int(used + cell["cpu_s"]) + 1
        resource.setrlimit(resource.RLIMIT_CPU, (soft, resource.RLIM_INFINITY))
        exit_code, memory_error = 0, False
        try:
            tree = ast.parse(cell["code"], "<cell>", "exec")
            last = tree.body[-1] if tree.body and isinstance(tree.body[-1], ast.Expr) else None
            if last is not None:
                tree.body.pop()
            exec(compile(tree, "<cell>", "exec"), namespace)
            if last is not None:
                value = eval(compile(ast.Expression(last.value), "<cell>", "eval"), namespace)
                if value is not None:
                    print(repr(value))
        except SystemExit as exc:
            exit_code = _exit_code(exc)
        except MemoryError:
            memory_error, exit_code = True, 1
            _print_exception()
        except BaseException:
            exit_code = 1
            _print_exception()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        frames.write_fd(tx, {"exit_code": exit_code, "memory_error": memory_error})


# ---- child-side helpers ----------------------------------------------------------------------


REHEARSAL = """
def _rows(n):
    return [(i, str(i), i * 0.5) for i in range(n)]
print(sum(range(10)), len(_rows(5)), {"k": [1, 2.5, None]}, "%s-%d" % ("x", 3), f"{1.5:.2f}")
"""


def _rehearse() -> None:
    """Walk an execution's code paths once on dummy data while no request is waiting: after a fork
    each first write to a page still shared with the zygote is a copy-on-write fault (a few us each
    in a VM, hundreds per execution), so taking them while the worker idles keeps them off the
    caller's clock. Writes nothing anywhere: its output goes to /dev/null."""
    frames.decode_body(b'{"op":"python","limits":{"wall_s":1.0},"payload_len":0}')
    base64.b64decode(base64.b64encode(b"rehearsal"))
    streams = sys.stdout, sys.stderr
    with open(os.devnull, "w", encoding="utf-8", errors="backslashreplace") as null:
        sys.stdout = sys.stderr = null
        try:
            _child_python(REHEARSAL, {"__name__": "__main__", "__builtins__": __builtins__}, finish=False)
        finally:
            sys.stdout, sys.stderr = streams


def _spare_stdio() -> tuple:
    """sys.stdin/stdout/stderr on fds 0-2 as `python -c` has them and a `__main__` module (so pickling
    a snippet's functions works), made once in the zygote for all its children (building them after
    each fork cost ~45 copy-on-write faults per execution). The wrappers cache what their file is like
    (seekable, a tty?) when made, so meanwhile fds 0-2 point at files like a child's: a memfd for
    stdin, a pipe for stdout/stderr. The zygote never writes to them nor runs code in `__main__`, so
    every child starts from the same pristine, empty copies."""
    saved = [os.dup(fd) for fd in (0, 1, 2)]
    memfd = os.memfd_create("stdin", 0)
    pipe_r, pipe_w = os.pipe()
    try:
        for src, dst in ((memfd, 0), (pipe_w, 1), (pipe_w, 2)):
            os.dup2(src, dst)
        streams = (
            open(0, closefd=False),  # noqa: SIM115
            open(1, "w", encoding="utf-8", errors="surrogateescape", closefd=False),  # noqa: SIM115
            open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False, buffering=1),  # noqa: SIM115
        )
    finally:
        for fd, old in enumerate(saved):
            os.dup2(old, fd)
        for fd in (*saved, memfd, pipe_r, pipe_w):
            os.close(fd)
    main = types.ModuleType("__main__")
    main.__builtins__ = __builtins__
    return (*streams, main)


def _take_stdio(stdio: tuple) -> dict:
    """In a child: become `python -c` with the zygote's ready-made streams and `__main__` (see
    `_spare_stdio`); returns the namespace to run code in."""
    sys.argv = [""]
    sys.stdin, sys.stdout, sys.stderr, main = stdio
    sys.modules["__main__"] = main
    return vars(main)


def _child_python(code: str, namespace: dict, finish: bool = True) -> tuple[int, bool]:
    """Run `code` in `namespace` as `python -c` would; returns (exit code, died of MemoryError).
    `finish`: then wait for its threads and run its atexit hooks (not in a rehearsal: that must
    leave no trace)."""
    exit_code, memory_error = 0, False
    try:
        exec(compile(code, "<string>", "exec"), namespace)
    except SystemExit as exc:
        exit_code = _exit_code(exc)
    except MemoryError:
        exit_code, memory_error = 1, True
        _print_exception()
    except BaseException:
        exit_code = 1
        _print_exception()
    if finish:
        try:
            threading = sys.modules.get("threading")  # as `python -c` does: no import, no threads to wait for
            if threading is not None:
                threading._shutdown()  # wait for non-daemon threads
            import atexit

            atexit._run_exitfuncs()
        except BaseException:
            pass
    for stream in (sys.stdout, sys.stderr):
        try:  # noqa: SIM105  (contextlib.suppress here would touch, and copy, contextlib's pages in every child)
            stream.flush()
        except BaseException:
            pass
    return exit_code & 0xFF, memory_error


def _write_files(files: dict) -> None:
    for rel, data in files.items():
        with os.fdopen(_open_in_work(rel, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "wb") as handle:
            handle.write(base64.b64decode(data))


def _open_in_work(rel: str, flags: int) -> int:
    """Open the regular file `rel` under the work dir without following a symlink on the way; with O_CREAT,
    missing directories are made. Raises OSError (a symlink: ELOOP or ENOTDIR; a FIFO: ENXIO; not a regular
    file: EINVAL) or ValueError (a path that leaves the work dir)."""
    parts = _inside_work(rel)[len(WORK) + 1 :].split("/")
    fd = os.open(WORK, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        for part in parts[:-1]:
            if flags & os.O_CREAT:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, dir_fd=fd)
            inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = inner
        # O_NONBLOCK: opening a FIFO never waits for its other end
        target = os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644, dir_fd=fd)
    finally:
        os.close(fd)
    if not stat.S_ISREG(os.fstat(target).st_mode):
        os.close(target)
        raise OSError(errno.EINVAL, f"{rel!r} is not a regular file")
    os.set_blocking(target, True)
    return target


def _make_work() -> None:
    """An empty work dir for the next spare (the cwd it runs code in), unless one is there."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(WORK)


def _die_with(parent: int) -> None:
    """SIGKILL us when the zygote dies, so no child outlives its worker (even without a PID namespace)."""
    _libc.prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(0)


def _print_exception() -> None:
    """Print the current exception's traceback without the zygote's own frame."""
    import traceback

    kind, value, tb = sys.exc_info()
    with contextlib.suppress(BaseException):
        traceback.print_exception(kind, value, tb.tb_next if tb is not None else None)


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    print(exc.code, file=sys.stderr)
    return 1


def _apply_limits(limits: dict, cpu_limit: bool = True) -> None:
    mib = 1024 * 1024
    cpu = max(1, math.ceil(limits["cpu_s"]))
    for name, soft, hard in (
        (resource.RLIMIT_CPU, cpu if cpu_limit else None, cpu + 1),
        (resource.RLIMIT_AS, limits["memory_mb"] * mib, limits["memory_mb"] * mib),
        (resource.RLIMIT_FSIZE, limits["file_size_mb"] * mib, limits["file_size_mb"] * mib),
        (resource.RLIMIT_NOFILE, limits["open_files"], limits["open_files"]),
        (resource.RLIMIT_NPROC, limits["processes"], limits["processes"]),
        (resource.RLIMIT_CORE, 0, 0),
    ):
        if soft is not None:
            resource.setrlimit(name, (soft, hard))


# ---- parent-side helpers ---------------------------------------------------------------------


class _Capture:
    """Moves a running child's stdout/stderr into memfds (kernel to kernel, via splice) up to the
    byte cap, while watching its meta pipe ("done" message) and its exit (pidfd). Stdout lands at
    offset HEAD of its memfd, leaving room for the reply header in front of it (see send_capture)."""

    HEAD = 4096

    def __init__(self, spare: Spare) -> None:
        self.spare = spare
        self.cap = 0  # set from the request's limits
        self.out = os.memfd_create("stdout", os.MFD_CLOEXEC)
        self.err = os.memfd_create("stderr", os.MFD_CLOEXEC)
        self.sizes = [0, 0]
        self.truncated = False
        self.meta = b""
        self.poller = select.poll()
        for fd in (spare.out_r, spare.err_r, spare.meta_r, spare.pidfd):
            self.poller.register(fd, select.POLLIN)

    def pump(self, deadline: float) -> tuple[str, dict | None]:
        spare, poller = self.spare, self.poller
        if self.meta.endswith(b"\n"):  # the "done" line came with the first one
            return "done", self._done()
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return "timeout", None
            for fd, _ in poller.poll(remaining * 1000):
                if fd == spare.pidfd:
                    return "exited", self._done()
                if fd == spare.meta_r:
                    chunk = os.read(fd, 4096)
                    if not chunk:
                        poller.unregister(fd)
                    self.meta += chunk
                    if self.meta.endswith(b"\n") or len(self.meta) > 4096:  # a snippet may write fd 3 too
                        return "done", self._done()
                elif self._move(fd) is None:
                    poller.unregister(fd)
                elif self.truncated:
                    return "output_limit", None

    def _done(self) -> dict | None:
        line = self.meta.partition(b"D")[2]  # meta is b"L" (payload loaded) then b"D<exit code> <0|1>\n" (finished)
        words = line.split()
        if not line.endswith(b"\n") or len(words) != 2 or not all(word.isdigit() for word in words):
            return None
        return {"exit_code": int(words[0]) & 0xFF, "memory_error": words[1] == b"1"}

    def _move(self, fd: int) -> int | None:
        """Splice what is readable on `fd`; None at EOF."""
        index = 0 if fd == self.spare.out_r else 1
        room = self.cap - sum(self.sizes)
        target, base = (self.out, self.HEAD) if index == 0 else (self.err, 0)
        try:
            moved = os.splice(fd, target, max(room, 0) + 1, offset_dst=base + self.sizes[index])
        except BlockingIOError:
            return 0
        if moved == 0:
            return None
        self.sizes[index] += moved
        if sum(self.sizes) > self.cap:
            self.sizes[index] -= sum(self.sizes) - self.cap
            os.ftruncate(target, base + self.sizes[index])
            self.truncated = True
        return moved

    def drain(self) -> None:
        os.set_blocking(self.spare.meta_r, False)  # the "L" may still sit unread if we stopped early
        with contextlib.suppress(BlockingIOError):
            self.meta += os.read(self.spare.meta_r, 4096)
        for fd in (self.spare.out_r, self.spare.err_r):
            os.set_blocking(fd, False)
            while not self.truncated and self._move(fd):
                pass

    def close(self) -> None:
        os.close(self.out)
        os.close(self.err)


class _Pipes:
    """stdout/stderr pipes of the REPL child, captured into bytes (the REPL is one episode's own)."""

    def __init__(self) -> None:
        self.out_r, self.out_w = os.pipe()
        self.err_r, self.err_w = os.pipe()
        self.out, self.err, self.truncated = bytearray(), bytearray(), False

    def become_child(self) -> None:
        null = os.open(os.devnull, os.O_RDONLY)
        for src, dst in ((null, 0), (self.out_w, 1), (self.err_w, 2)):
            os.dup2(src, dst)

    def close_child_ends(self) -> None:
        for fd in (self.out_w, self.err_w):
            os.close(fd)

    def close(self) -> None:
        for fd in (self.out_r, self.err_r):
            with contextlib.suppress(OSError):
                os.close(fd)

    def pump(self, pid: int, deadline: float, cap: int, on_kill, done_fd: int) -> str:
        """Collect output until `done_fd` is readable or the child exits. Returns why it stopped."""
        poller = select.poll()
        streams = {self.out_r: self.out, self.err_r: self.err}
        for fd in (*streams, done_fd):
            poller.register(fd, select.POLLIN)
        pidfd = os.pidfd_open(pid)
        poller.register(pidfd, select.POLLIN)
        reason = ""
        try:
            while not reason:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    reason = "timeout"
                    break
                for fd, _ in poller.poll(remaining * 1000):
                    if fd in streams:
                        chunk = os.read(fd, 65536)
                        if not chunk:
                            poller.unregister(fd)
                        elif self._append(streams[fd], chunk, cap):
                            reason = "output_limit"
                    elif fd in (pidfd, done_fd):
                        reason = "exited" if fd == pidfd else "done"
            if reason in ("exited", "done"):
                for fd, buf in streams.items():
                    os.set_blocking(fd, False)
                    while not self.truncated:
                        try:
                            chunk = os.read(fd, 65536)
                        except BlockingIOError:
                            break
                        if not chunk or self._append(buf, chunk, cap):
                            break
                    os.set_blocking(fd, True)
            else:
                on_kill()
        finally:
            os.close(pidfd)
        return reason

    def _append(self, buf: bytearray, chunk: bytes, cap: int) -> bool:
        room = cap - len(self.out) - len(self.err)
        if len(chunk) > room:
            buf += chunk[: max(room, 0)]
            self.truncated = True
            return True
        buf += chunk
        return False


def _classify(outcome: str, done: dict | None, reaped, limits: dict) -> dict:
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


def _first_line(spare: Spare) -> tuple[bytes, dict | None, bytes]:
    """Wait (as long as it takes) for an autonomous spare's first meta line: (kind, message, rest)."""
    poller = select.poll()
    poller.register(spare.meta_r, select.POLLIN)
    buffer = b""
    while b"\n" not in buffer:
        poller.poll()
        chunk = os.read(spare.meta_r, 4096)
        if not chunk:
            return b"", None, b""  # died without a word
        buffer += chunk
    line, _, rest = buffer.partition(b"\n")
    kind, message = line[:1], None
    if kind == b"O":  # b"O<wall_s> <max_output_bytes> <cpu_s>"
        wall_s, cap, cpu_s = line[1:].split()
        message = {"limits": {"wall_s": float(wall_s), "max_output_bytes": int(cap), "cpu_s": float(cpu_s)}}
    elif kind == b"H":
        message = frames.decode_body(line[1:])
    return kind, message, rest


def _jail_pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid in _jail_pids():
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


def _kill(pid: int) -> None:
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


# A container's own cgroup OOM counter, when mounted (the local jails have no /sys: their host reads the cgroup).
_OOM_EVENTS = [
    p for p in ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control") if os.path.exists(p)
]


def _oom_kills() -> int:
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


def _inside_work(rel: str) -> str:
    path = os.path.normpath(os.path.join(WORK, rel))
    if not path.startswith(WORK + "/"):
        raise ValueError(f"path {rel!r} leaves the work directory")
    return path


def _remove(path: str) -> None:
    """Delete a file or a whole tree, even one whose directories a snippet made unreadable. By path
    (no shutil: its import maps bz2 and lzma into every fork), which is safe here: the jail's
    processes are all dead by now, none can swap a directory for a symlink under us."""
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            os.chmod(path, 0o700)
            for root, dirs, _ in os.walk(path):
                for d in dirs:
                    entry = os.path.join(root, d)
                    if not os.path.islink(entry):  # chmod would follow it out of the tree
                        with contextlib.suppress(OSError):
                            os.chmod(entry, 0o700)
            for root, dirs, files in os.walk(path, topdown=False):
                for name in files:
                    with contextlib.suppress(OSError):
                        os.unlink(os.path.join(root, name))
                for name in dirs:  # a symlink to a directory is listed here too
                    entry = os.path.join(root, name)
                    with contextlib.suppress(OSError):
                        if os.path.islink(entry):
                            os.unlink(entry)
                        else:
                            os.rmdir(entry)
            os.rmdir(path)
        else:
            os.unlink(path)
    except OSError:
        pass


if __name__ == "__main__":
    Zygote(json.loads(sys.argv[1])).serve()
