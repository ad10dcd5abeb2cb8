"""Host-side handle of one warm worker: start handshake, framed request/reply with deadlines, and
teardown. `JailWorker` runs the zygote in bubblewrap (or, unsafe, as a bare subprocess)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from sandboxes import jail
from sandboxes.cgroups import SlotCgroup
from sandboxes.errors import WorkerDied
from sandboxes.injail import frames

READY_TIMEOUT_S = 60.0
REPLY_GRACE_S = 10.0


class Worker:
    """Transport-independent part: subclasses provide _send, _recv_exact, _kill and _alive."""

    provider = "?"
    async_io = False  # True: request_async serves the channel on the event loop

    def __init__(self) -> None:
        self.executions = 0
        self.info: dict = {}
        self.cgroup: SlotCgroup | None = None

    def handshake(self) -> dict:
        reply = self._recv(time.monotonic() + READY_TIMEOUT_S)
        if not reply.get("ready"):
            raise WorkerDied(f"{self.provider} worker did not start: {reply}")
        self.info = reply
        return reply

    def request(self, message: dict, timeout_s: float, payload: dict | None = None) -> dict:
        """Send one request (plus its payload frame) and wait for the reply. A reply that announces
        output carries it as raw bytes under "stdout"/"stderr". Any transport failure kills this
        worker and raises WorkerDied."""
        try:
            data = _request_bytes(message, payload)
            deadline = time.monotonic() + timeout_s + REPLY_GRACE_S
            self._send(data, deadline)
            reply = self._recv_reply(deadline)
        except (OSError, ValueError, frames.FrameError, WorkerDied) as exc:
            self.kill()
            raise self._failure(message, exc) from None
        return self._accept(reply)

    def _failure(self, message: dict, exc: BaseException) -> WorkerDied:
        return WorkerDied(f"{self.provider} worker failed during {message.get('op')!r}: {exc}{self._diagnostics()}")

    def _accept(self, reply: dict) -> dict:
        self.executions += 1
        if not reply.get("healthy", True):
            self.info["unhealthy"] = True
        return reply

    def _recv_reply(self, deadline: float) -> dict:
        reply = self._recv(deadline)
        if "stdout_len" in reply:
            out_len, err_len = _output_lengths(reply)
            reply["stdout"] = self._recv_exact(out_len, deadline) if out_len else b""
            reply["stderr"] = self._recv_exact(err_len, deadline) if err_len else b""
        return reply

    def _recv(self, deadline: float) -> dict:
        header = self._recv_exact(4, deadline)
        return frames.decode_body(self._recv_exact(frames.body_length(header), deadline))

    def _diagnostics(self) -> str:
        return ""

    @property
    def usable(self) -> bool:
        return self._alive() and not self.info.get("unhealthy")

    def kill(self) -> None:
        self._kill()
        if self.cgroup is not None:
            self.cgroup.kill_all()

    def close(self) -> None:
        raise NotImplementedError

    def _send(self, data: bytes, deadline: float) -> None:
        raise NotImplementedError

    def _recv_exact(self, n: int, deadline: float) -> bytes:
        raise NotImplementedError

    def _kill(self) -> None:
        raise NotImplementedError

    def _alive(self) -> bool:
        raise NotImplementedError


class JailWorker(Worker):
    """A zygote inside bubblewrap, started as an unprivileged per-slot uid (when we are root) inside
    a per-slot cgroup (when cgroups are writable)."""

    provider = "local"
    async_io = True

    def __init__(
        self,
        *,
        python: str,
        config: dict,
        site_dirs: list[str],
        binds: list[tuple[str, str]] = (),
        uid: int | None,
        cgroup: SlotCgroup | None,
        isolate: bool = True,
    ) -> None:
        super().__init__()
        self.cgroup = cgroup
        self.scratch: str | None = None
        self.on_closed: Callable[[], None] | None = None  # called once, at the end of the first close()
        self._close_lock = threading.Lock()
        self._closed = False
        fds: list[int] = []
        if isolate:
            argv, fds = jail.bwrap_argv(python, config, site_dirs, binds)
        else:
            argv = [python, "-I", "-S", os.path.join(jail.IN_JAIL_DIR, "zygote.py"), json.dumps(config)]
        argv = jail.launcher_argv(cgroup.procs_files() if cgroup is not None else [], argv)
        privilege = {} if uid is None else {"user": uid, "group": uid, "extra_groups": []}
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=jail.LAUNCH_ENV if isolate else {**jail.JAIL_ENV},
            cwd="/",
            start_new_session=True,
            close_fds=True,
            pass_fds=fds,
            **privilege,
        )
        for fd in fds:
            os.close(fd)
        self._rx = self.proc.stdout.fileno()
        self._tx = self.proc.stdin.fileno()
        self._buffer = bytearray()
        os.set_blocking(self._rx, False)
        os.set_blocking(self._tx, False)
        try:
            self.handshake()
        except BaseException:
            self.close()
            raise

    # ---- channel: non-blocking pipe fds, served by select (blocking callers) or the event loop
    def _send(self, data: bytes, deadline: float) -> None:
        view = memoryview(data)
        while True:
            view = view[_write_some(self._tx, view) :]
            if not view:
                return
            _wait_fd(self._tx, deadline, write=True)

    def _recv_reply(self, deadline: float) -> dict:
        while (reply := self._take_reply()) is None:
            _wait_fd(self._rx, deadline, write=False)
            self._read_chunk()
        return reply

    def _recv_exact(self, n: int, deadline: float) -> bytes:
        while len(self._buffer) < n:
            _wait_fd(self._rx, deadline, write=False)
            self._read_chunk()
        data = bytes(self._buffer[:n])
        del self._buffer[:n]
        return data

    def _read_chunk(self) -> None:
        try:
            chunk = os.read(self._rx, 1 << 16)
        except BlockingIOError:
            return
        if not chunk:
            raise WorkerDied(f"worker exited (rc={self.proc.poll()})")
        self._buffer += chunk

    def _take_reply(self) -> dict | None:
        """The next whole reply (header frame plus the output it announces) from the read buffer, if it is in."""
        buffer = self._buffer
        if len(buffer) < 4:
            return None
        length = frames.body_length(buffer[:4])
        if len(buffer) < 4 + length:
            return None
        reply = frames.decode_body(buffer[4 : 4 + length])
        end = 4 + length
        if "stdout_len" in reply:
            out_len, err_len = _output_lengths(reply)
            if len(buffer) < end + out_len + err_len:
                return None
            reply["stdout"] = bytes(buffer[end : end + out_len])
            reply["stderr"] = bytes(buffer[end + out_len : end + out_len + err_len])
            end += out_len + err_len
        del buffer[:end]
        return reply

    async def request_async(self, message: dict, timeout_s: float, payload: dict | None = None) -> dict:
        """`request` served by the running event loop (no thread): the same deadlines; on failure the
        worker is killed off the loop and WorkerDied raised."""
        loop = asyncio.get_running_loop()
        try:
            data = memoryview(_request_bytes(message, payload))
            deadline = time.monotonic() + timeout_s + REPLY_GRACE_S
            while data := data[_write_some(self._tx, data) :]:
                await self._ready(loop, deadline, write=True)
            while (reply := self._take_reply()) is None:
                await self._ready(loop, deadline, write=False)
                self._read_chunk()
        except (OSError, ValueError, frames.FrameError, WorkerDied) as exc:
            await loop.run_in_executor(None, self.kill)
            raise self._failure(message, exc) from None
        except asyncio.CancelledError:  # a reply may still be on its way: never reuse this channel
            self.info["unhealthy"] = True
            raise
        return self._accept(reply)

    async def _ready(self, loop: asyncio.AbstractEventLoop, deadline: float, *, write: bool) -> None:
        """Wait until the channel can be written (write=True) or read, or raise WorkerDied at `deadline`."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise WorkerDied(f"no reply within the deadline ({len(self._buffer)} bytes received)")
        ready = loop.create_future()
        fd = self._tx if write else self._rx
        (loop.add_writer if write else loop.add_reader)(fd, _set_if_pending, ready)
        timer = loop.call_later(remaining, _set_if_pending, ready)
        try:
            await ready
        finally:
            (loop.remove_writer if write else loop.remove_reader)(fd)
            timer.cancel()

    def _diagnostics(self) -> str:
        if self.proc.poll() is None:
            return ""
        try:
            os.set_blocking(self.proc.stderr.fileno(), False)
            err = (self.proc.stderr.read(4000) or b"").decode(errors="replace").strip()
        except OSError:
            err = ""
        return f"; worker stderr: {err}" if err else ""

    def _alive(self) -> bool:
        return self.proc.poll() is None

    def _kill(self) -> None:
        """SIGTERM the launcher: it SIGKILLs the jail and reaps it. SIGKILL the group if it lingers."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=3)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def close(self) -> None:
        """Ask the zygote to exit (EOF), then make sure: kill, reap, empty and remove the cgroup. Idempotent and
        safe from several threads: only the first call does it (the others wait for it), since once the slot
        number is given back a new worker may own the same cgroup path, which a second teardown would empty."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
            self._teardown()

    def _teardown(self) -> None:
        for stream in (self.proc.stdin,):
            with contextlib.suppress(OSError):
                stream.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=2)
        self.kill()
        for stream in (self.proc.stdout, self.proc.stderr):
            stream.close()
        if self.cgroup is not None:
            self.cgroup.remove()
        if self.scratch:
            shutil.rmtree(self.scratch, ignore_errors=True)
        on_closed, self.on_closed = self.on_closed, None
        if on_closed is not None:
            on_closed()


def _request_bytes(message: dict, payload: dict | None) -> bytes:
    if payload is None:
        return frames.encode(message)
    body = frames.encode(payload)
    return frames.encode({**message, "payload_len": len(body)}) + body


def _output_lengths(reply: dict) -> tuple[int, int]:
    out_len, err_len = reply["stdout_len"], reply.get("stderr_len", 0)
    for value in (out_len, err_len):
        if not isinstance(value, int) or not 0 <= value <= frames.MAX_FRAME_BYTES:
            raise frames.FrameError(f"reply announces {value!r} output bytes")
    return out_len, err_len


def _write_some(fd: int, data: memoryview) -> int:
    try:
        return os.write(fd, data)
    except BlockingIOError:
        return 0


def _wait_fd(fd: int, deadline: float, *, write: bool) -> None:
    """Wait until ``fd`` is ready or the deadline passes (poll, not select: a process holding many sessions has
    descriptors past select's 1,024)."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise WorkerDied("no reply within the deadline")
    waiter = select.poll()
    waiter.register(fd, select.POLLOUT if write else select.POLLIN)
    waiter.poll(remaining * 1000)


def _set_if_pending(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


def default_python() -> str:
    """The jail's interpreter: the system one (world-readable under /usr), else our own."""
    for candidate in ("/usr/bin/python3",):
        if os.access(candidate, os.X_OK):
            return candidate
    return sys.executable
