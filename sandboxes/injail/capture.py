"""Output capture: a running child's stdout/stderr collected up to the byte cap while the zygote watches for its
"done" message and its exit.

`Capture` serves one-shot executions: the output is spliced kernel to kernel into memfds and leaves in one
`sendfile` behind the reply header (`Capture.send`), so it never enters the zygote's memory and nothing of one
execution survives there for a later fork to find. `Pipes` serves the persistent REPL, one episode's own
process, whose output is read into bytes.
"""

from __future__ import annotations

import contextlib
import os
import select
import time

import frames


class Capture:
    """Moves a running spare's stdout/stderr into memfds (kernel to kernel, via splice) up to the
    byte cap, while watching its meta pipe ("done" message) and its exit (pidfd). Stdout lands at
    offset HEAD of its memfd, leaving room for the reply header in front of it (see `send`)."""

    HEAD = 4096

    def __init__(self, spare) -> None:
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

    def send(self, tx: int, reply: dict) -> None:
        """Reply header, stdout and stderr in one sendfile from the stdout memfd (the host wakes once),
        the output never entering our memory: the header goes in front of stdout, stderr after it."""
        out, err = self.sizes
        header = frames.encode({**reply, "stdout_len": out, "stderr_len": err})
        start, end = self.HEAD - len(header), self.HEAD + out
        if start < 0:  # our replies are far smaller
            raise frames.FrameError(f"reply header of {len(header)} bytes")
        os.pwrite(self.out, header, start)
        copied = 0
        while copied < err:
            step = os.copy_file_range(self.err, self.out, err - copied, copied, end + copied)
            if step == 0:
                raise OSError("copy_file_range made no progress")
            copied += step
        end += err
        while start < end:
            sent = os.sendfile(tx, self.out, start, end - start)
            if sent == 0:
                raise OSError("sendfile made no progress")
            start += sent

    def close(self) -> None:
        os.close(self.out)
        os.close(self.err)


class Pipes:
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
