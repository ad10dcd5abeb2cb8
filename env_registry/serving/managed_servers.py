"""The env servers this process starts for isolated installs, each in the install's own interpreter.

``ManagedServer`` runs ``python -m env_registry.cli serve-env ID``
under another interpreter (an isolated install's venv), waits until it answers, restarts it when it has died or
stopped answering, and stops it when this process exits; if this process is killed instead, the server exits when
its standard input closes, and the next process to start a server deletes its log (named by its owner's tag,
``sandboxes.owner``). ``managed_endpoint`` hands out one server per (interpreter, ID) per process. Under Ray
the trainer starts these servers in Ray actors instead (``molt_train.env_server_actors``), one per rollout worker.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import os
import re
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from env_registry.errors import EnvServerUnavailable, Error
from env_registry.serving.urls import check_server
from molt_envs.remote.client import TIMEOUT_S, Endpoint
from sandboxes import owner

START_TIMEOUT_S = float(os.environ.get("MOLT_ENV_START_TIMEOUT_S", "120"))
PROBE_TIMEOUT_S = 5.0  # a server that cannot answer /health in this long is hung, and is restarted
MAX_RESTARTS = 20  # per server and process: past this, its episodes fail as remote_connect without more restarts
READY = re.compile(r" at (https?://\S+?)/(\S+) \(")
_LEAVE_OUT_OF_CHILD = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV")

LOG_PREFIX = "molt-env-server-"  # + this process's owner tag (sandboxes.owner) and a random tail: a server's log

log = logging.getLogger("env_registry.serving.managed_servers")
_logs_reaped = False


def _reap_logs() -> None:
    """Once per process: delete the server logs of processes that are gone without stopping their servers (killed by
    SIGKILL: their servers exit when their stdin closes, but nothing else deletes the log)."""
    global _logs_reaped
    if _logs_reaped:
        return
    _logs_reaped = True
    with contextlib.suppress(OSError):
        for entry in os.scandir(tempfile.gettempdir()):
            tag = entry.name.removeprefix(LOG_PREFIX).rpartition("-")[0]
            if entry.name.startswith(LOG_PREFIX) and entry.name.endswith(".log") and tag and owner.gone(tag):
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)


class ManagedServer:
    """``serve-env ENV_ID`` under ``python``, started by this process. ``where`` names it in errors; ``serve_as`` is
    the ID given to ``serve-env`` when it differs from the ID served (``rg:countdown?min_numbers=3`` serves
    ``rg:countdown``)."""

    def __init__(
        self, python: str, env_id: str, where: str, expected_hash: str | None = None, serve_as: str | None = None
    ) -> None:
        self.python, self.env_id, self.where, self.expected_hash = python, env_id, where, expected_hash
        self.serve_as = serve_as or env_id
        self.process: subprocess.Popen | None = None
        self.base_url: str | None = None
        self.metadata: Any = None  # the server's molt_envs.remote.protocol.Metadata, once started
        self.restarts = 0
        _reap_logs()
        fd, name = tempfile.mkstemp(prefix=f"{LOG_PREFIX}{owner.tag()}-", suffix=".log")
        os.close(fd)
        self.log_path = Path(name)

    def start(self) -> str:
        """Start the server and wait until it answers as an env server serving ``env_id``; returns its base URL.

        Raises:
            EnvServerUnavailable: it did not start (the log's tail says why), or it serves another spec hash.
        """
        cmd = self.command()
        env = {k: v for k, v in os.environ.items() if k not in _LEAVE_OUT_OF_CHILD}
        with self.log_path.open("ab") as log_file:
            try:
                self.process = subprocess.Popen(
                    cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log_file, env=env, start_new_session=True
                )
            except OSError as exc:
                raise EnvServerUnavailable(f"cannot start the env server of {self.where}: {exc}") from None
        found: list[str] = []
        threading.Thread(target=self._pump, args=(self.process, found), daemon=True, name="env-server-log").start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not found and self.process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if not found:
            why = "exited" if self.process.poll() is not None else f"did not answer within {START_TIMEOUT_S:g} s"
            self.stop()
            raise EnvServerUnavailable(
                f"the env server of {self.where} {why} (`{' '.join(cmd)}`); its log ({self.log_path}) ends:\n"
                + self.log_tail()
            )
        self.base_url = found[0]
        try:
            self.check()
        except Error:
            self.stop()
            raise
        return self.base_url

    def command(self) -> list[str]:
        """The server's command line; it prints a ready line naming its URL on stdout (``ready_url`` reads it)."""
        return [self.python, "-m", "env_registry.cli", "serve-env", self.serve_as, "--port", "0", "--exit-on-stdin-eof"]

    def ready_url(self, line: str) -> str | None:
        """The base URL a line of the server's stdout says it is ready at, if it is its ready line."""
        match = READY.search(line)
        return match[1] if match and match[2] == self.env_id else None

    def check(self) -> None:
        """Check that what answers at ``base_url`` is the server meant (raises an ``Error`` naming what is wrong)."""
        metadata = check_server(self.base_url, self.env_id)
        self.metadata = metadata
        if self.expected_hash is not None and metadata.hash != self.expected_hash:
            raise EnvServerUnavailable(
                f"{self.where} now serves {self.env_id} with spec hash {metadata.hash}, but it was installed with "
                f"{self.expected_hash}; reinstall it (`molt-env install {self.env_id} --isolated`)"
            )

    def _pump(self, process: subprocess.Popen, found: list[str]) -> None:
        """Copy the server's stdout to its log (a full pipe would stall it), noting the URL of its ready line."""
        with self.log_path.open("ab") as log_file, process.stdout:
            for line in process.stdout:
                log_file.write(line)
                log_file.flush()
                url = self.ready_url(line.decode(errors="replace"))
                if url and not found:
                    found.append(url)

    def healthy(self, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
        """Alive and answering ``/health`` within ``timeout_s``."""
        import httpx

        if self.process is None or self.process.poll() is not None:
            return False
        try:
            return httpx.get(f"{self.base_url}/health", timeout=timeout_s).status_code == 200
        except httpx.HTTPError:
            return False

    def restart(self) -> str:
        """Kill it (it is dead or hung) and start it again; returns the new base URL."""
        self.stop(graceful=False)
        self.restarts += 1
        log.warning("restarting the env server of %s (restart %d)", self.where, self.restarts)
        return self.start()

    def stop(self, graceful: bool = True) -> None:
        """Close its stdin (it exits by itself), then terminate, then kill. Not ``graceful`` (it is hung, or stopped
        by ``SIGSTOP``, which no ``SIGTERM`` would get past): ``SIGKILL`` to its process group at once (the server
        and what it started that stayed in its session)."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        if not graceful:
            with contextlib.suppress(OSError):
                os.killpg(process.pid, signal.SIGKILL)  # its own group: started with start_new_session
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                process.kill()
                process.wait(timeout=5)
            return
        for step in (process.stdin.close, process.terminate, process.kill):
            try:
                step()
                process.wait(timeout=5 if graceful else 2)
                return
            except subprocess.TimeoutExpired:
                continue
            except OSError:
                pass

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").strip().splitlines()[-lines:])
        except OSError:
            return "(no log)"


class ManagedEndpoint(Endpoint):
    """The endpoint of a ``ManagedServer``: after a wire failure the server is probed and, if it is dead or hung
    (``/health`` unanswered within ``PROBE_TIMEOUT_S``: a stopped process, a wedged event loop), killed and
    restarted (once per failure wave: failures of connections opened before the restart are ignored). That runs in
    a thread of its own: the episodes that failed end at once, and episodes that start meanwhile wait for it
    (``ws_url``). The server's ``max_episodes`` (its metadata's, if it has any) bounds the episodes open at once.

    ``server`` is a ``ManagedServer``, or anything with its ``base_url``, ``env_id``, ``where`` and ``restarts``
    and its ``healthy()`` and ``restart()`` (the trainer's env servers, owned by Ray actors, are driven so).
    """

    def __init__(self, server: ManagedServer, timeout_s: float = TIMEOUT_S) -> None:
        super().__init__(server.base_url, server.env_id, timeout_s=timeout_s, capacity=_capacity(server))
        self.server = server
        self._lock = threading.Lock()
        self._settled = threading.Event()
        self._settled.set()

    async def ws_url(self) -> str:
        if not self._settled.is_set():
            await asyncio.to_thread(self._settled.wait, START_TIMEOUT_S + PROBE_TIMEOUT_S)
        return await super().ws_url()

    def settled(self, timeout_s: float | None = None) -> bool:
        """Wait until no probe or restart is in progress (at most ``timeout_s``); True if none is."""
        return self._settled.wait(timeout_s)

    async def recover(self, generation: int, wait: bool = True) -> None:
        with self._lock:
            begin = generation == self.generation and self._settled.is_set()
            if begin:
                self._settled.clear()  # from now on, new episodes wait for the outcome
        if begin:
            threading.Thread(target=self._recover, daemon=True, name="env-server-recover").start()
        if wait:
            await asyncio.to_thread(self._settled.wait, START_TIMEOUT_S + PROBE_TIMEOUT_S)

    def _recover(self) -> None:
        try:
            if self.server.healthy():
                return
            if self.server.restarts >= MAX_RESTARTS:
                log.error("the env server of %s was restarted %d times; not again", self.server.where, MAX_RESTARTS)
                return
            try:
                self.base_url = self.server.restart()
                self.slots.resize(_capacity(self.server))
            except Error as exc:  # its episodes fail to connect, and each tries again
                log.error("%s", exc)
            finally:
                self.generation += 1
        except Exception:  # (a probe that raised: the next failure probes again)
            log.exception("recovering the env server of %s", self.server.where)
        finally:
            self._settled.set()


def _capacity(server: Any) -> int | None:
    """The server's ``max_episodes``, where its metadata says (a ``ManagedServer``'s, once started)."""
    return getattr(getattr(server, "metadata", None), "max_episodes", None)


_ENDPOINTS: dict[tuple[str, str], ManagedEndpoint] = {}
_ENDPOINTS_LOCK = threading.Lock()


def managed_endpoint(
    python: str,
    env_id: str,
    where: str,
    expected_hash: str | None = None,
    serve_as: str | None = None,
    server_type: type[ManagedServer] = ManagedServer,
) -> ManagedEndpoint:
    """The endpoint of this process's server for ``env_id`` (given to ``serve-env`` as ``serve_as``) under ``python``,
    started on first use; ``server_type`` is a ``ManagedServer`` subclass running another command (OpenEnv's).

    Raises:
        EnvServerUnavailable: the server does not start (see ``ManagedServer.start``).
    """
    key = (python, serve_as or env_id)
    with _ENDPOINTS_LOCK:
        if key not in _ENDPOINTS:
            server = server_type(python, env_id, where, expected_hash, serve_as)
            server.start()
            _ENDPOINTS[key] = ManagedEndpoint(server)
        return _ENDPOINTS[key]


@atexit.register
def stop_managed_servers() -> None:
    """Stop every server this process started (also run at exit)."""
    with _ENDPOINTS_LOCK:
        endpoints = list(_ENDPOINTS.values())
        _ENDPOINTS.clear()
    for endpoint in endpoints:
        endpoint.server.stop()
        endpoint.server.log_path.unlink(missing_ok=True)
