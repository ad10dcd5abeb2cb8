"""Spares: the child the zygote forks while it is idle, waiting for the next request, and what it says back.

An *autonomous* spare (one-shot sessions) reads its request from the host's channel itself and tells the zygote on
its meta pipe, in one write once the payload is in: b"O<wall_s> <max_output_bytes> <cpu_s>\\n" (the limits the
zygote enforces, as plain numbers: the zygote parses no JSON per call), then b"L" (payload loaded), and at the end
b"D<exit code> <0|1 MemoryError>\\n". A request that is not an execution goes back as b"H<header>\\n"; a closed
channel as b"E\\n". A spare of a persistent session gets its op and limits from the zygote on its go pipe instead.
While no request comes, a spare rehearses an execution on dummy data (`rehearse`), taking its copy-on-write faults
off the caller's clock.
"""

from __future__ import annotations

import base64
import contextlib
import os
import select
import signal
import sys

import frames
import landlock
from child import apply_limits, child_python, die_with, take_stdio
from workdir import write_files

# A spare rehearses (see `rehearse`) only when no request came for this long: under steady traffic
# the next request is due any moment and the rehearsal would only compete with it for the cores.
REHEARSE_AFTER_S = 0.002


class Spare:
    """A pre-forked child waiting for its request. `autonomous`: it rehearses an execution (see
    `rehearse`) once no request came for REHEARSE_AFTER_S, then reads the request itself and tells
    the zygote ("O" line with the limits it enforces on its meta pipe, followed by "L", in one write
    once the payload is in), saving a hand-off; otherwise the zygote reads the header and passes it
    on the go pipe (persistent sessions, whose zygote also serves REPL and file requests)."""

    def __init__(self, zygote, autonomous: bool = False) -> None:
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

    def _main(self, zygote, parent_ends: list[int]) -> None:
        try:
            for fd in parent_ends:
                os.close(fd)
            die_with(zygote.pid)
            os.setsid()
            if zygote.scope_fd is not None:
                landlock.restrict_self(zygote.scope_fd)
            # The child's stdio, set up before the request: stdin an empty memfd (the payload's
            # bytes go in later), stdout/stderr the capture pipes.
            memfd = os.memfd_create("stdin", 0)
            for src, dst in ((memfd, 0), (self.out_w, 1), (self.err_w, 2)):
                os.dup2(src, dst)
            os.close(memfd)
            namespace = take_stdio(zygote.stdio)
            if self.autonomous:
                if not select.select([zygote.rx], [], [], REHEARSE_AFTER_S)[0]:  # the worker is idle
                    rehearse()
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
            write_files(payload.get("files", {}))
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
            apply_limits(order["limits"])
            os.chdir(zygote.work)
            if order["op"] == "exec":
                os.set_inheritable(3, False)
                signal.signal(signal.SIGPIPE, signal.SIG_DFL)
                argv = payload["argv"]
                try:
                    os.execvp(argv[0], argv)
                except OSError as exc:
                    os.write(2, f"sandbox: cannot execute {argv[0]!r}: {exc.strerror}\n".encode())
                    os._exit(127)
            exit_code, memory_error = child_python(payload["code"], namespace)
            os.write(3, b"D%d %d\n" % (exit_code, memory_error))
            os._exit(exit_code)
        except BaseException:
            os._exit(126)


def first_line(spare: Spare) -> tuple[bytes, dict | None, bytes]:
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


REHEARSAL = """
def _rows(n):
    return [(i, str(i), i * 0.5) for i in range(n)]
print(sum(range(10)), len(_rows(5)), {"k": [1, 2.5, None]}, "%s-%d" % ("x", 3), f"{1.5:.2f}")
"""


def rehearse() -> None:
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
            child_python(REHEARSAL, {"__name__": "__main__", "__builtins__": __builtins__}, finish=False)
        finally:
            sys.stdout, sys.stderr = streams
