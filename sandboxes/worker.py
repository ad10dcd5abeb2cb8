"""Host-side handle of one warm worker: start handshake, framed request/reply with deadlines, and
teardown. `JailWorker` runs the zygote in bubblewrap (or, unsafe, as a bare subprocess)."""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time

from sandboxes import frames, jail
from sandboxes.cgroups import SlotCgroup
from sandboxes.errors import WorkerDied

READY_TIMEOUT_S = 60.0
REPLY_GRACE_S = 10.0


class Worker:
    """Transport-independent part: subclasses provide _send, _recv_exact, _kill and _alive."""

    provider = "?"

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
            data = frames.encode(message if payload is None else {**message, "payload_len": 0})
            if payload is not None:
                body = frames.encode(payload)
                data = frames.encode({**message, "payload_len": len(body)}) + body
            self._send(data)
            deadline = time.monotonic() + timeout_s + REPLY_GRACE_S
            reply = self._recv(deadline)
            if "stdout_len" in reply:
                reply["stdout"] = self._recv_exact(reply["stdout_len"], deadline) if reply["stdout_len"] else b""
                reply["stderr"] = self._recv_exact(reply["stderr_len"], deadline) if reply["stderr_len"] else b""
        except (OSError, ValueError, frames.FrameError, WorkerDied) as exc:
            self.kill()
            raise WorkerDied(
                f"{self.provider} worker failed during {message.get('op')!r}: {exc}{self._diagnostics()}"
            ) from None
        self.executions += 1
        if not reply.get("healthy", True):
            self.info["unhealthy"] = True
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

    def _send(self, data: bytes) -> None:
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

    def __init__(
        self,
        *,
        python: str,
        config: dict,
        site_dirs: list[str],
        uid: int | None,
        cgroup: SlotCgroup | None,
        isolate: bool = True,
    ) -> None:
        super().__init__()
        self.cgroup = cgroup
        self.scratch: str | None = None
        fds: list[int] = []
        if isolate:
            argv, fds = jail.bwrap_argv(python, config, site_dirs)
        else:
            argv = [python, "-I", "-S", os.path.join(jail.PACKAGE_DIR, "zygote.py"), json.dumps(config)]
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
        try:
            self.handshake()
        except BaseException:
            self.close()
            raise

    def _send(self, data: bytes) -> None:
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def _recv_exact(self, n: int, deadline: float) -> bytes:
        chunks, need = [], n
        while need:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise WorkerDied(f"no reply within the deadline ({n - need}/{n} bytes received)")
            ready, _, _ = select.select([self._rx], [], [], remaining)
            if not ready:
                continue
            chunk = os.read(self._rx, need)
            if not chunk:
                raise WorkerDied(f"worker exited (rc={self.proc.poll()})")
            chunks.append(chunk)
            need -= len(chunk)
        return b"".join(chunks)

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
        """Ask the zygote to exit (EOF), then make sure: kill, reap, empty and remove the cgroup."""
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


def default_python() -> str:
    """The jail's interpreter: the system one (world-readable under /usr), else our own."""
    for candidate in ("/usr/bin/python3",):
        if os.access(candidate, os.X_OK):
            return candidate
    return sys.executable
