"""The public entry point: `sandboxes.open(provider, ...)` returns an async Sandbox session.

Pools of warm workers are shared per process (keyed by provider and worker settings), so opening a
session per episode is cheap; a `persistent=True` session instead owns one dedicated worker whose
Python globals survive between `run_python` calls (a REPL), released when the session closes.
"""

from __future__ import annotations

import asyncio
import atexit
import base64
import threading
from collections.abc import Mapping, Sequence
from typing import Protocol

from sandboxes.errors import SandboxError, SandboxUnavailable
from sandboxes.limits import Limits
from sandboxes.result import Result

PROVIDERS = ("local", "docker", "ray", "auto")


class Session(Protocol):
    """A dedicated worker (persistent mode)."""

    async def call(self, header: dict, payload: dict | None, limits: Limits) -> Result | dict: ...

    async def close(self) -> None: ...


class Backend(Protocol):
    """What a provider implements; shared by every Sandbox opened with the same settings."""

    name: str

    async def run(self, header: dict, payload: dict, limits: Limits) -> Result: ...

    async def open_session(self) -> Session: ...

    def close(self) -> None: ...


_backends: dict[tuple, Backend] = {}
_backends_lock = threading.Lock()


def _backend(provider: str, options: dict, unsafe: bool, limits: Limits) -> Backend:
    key = (provider, unsafe, tuple(sorted((k, _hashable(v)) for k, v in options.items())))
    with _backends_lock:
        backend = _backends.get(key)
        if backend is None:
            backend = _make_backend(provider, options, unsafe, limits)
            _backends[key] = backend
        return backend


def _ray_running() -> bool:
    import sys

    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized()


def _hashable(value: object) -> object:
    if isinstance(value, (list, tuple)):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    return value


def _make_backend(provider: str, options: dict, unsafe: bool, limits: Limits) -> Backend:
    if provider == "auto":
        from sandboxes.probe import probe

        report = probe()
        if report.auto is None:
            raise SandboxUnavailable(
                "no sandbox provider works on this host: local is missing "
                + "; ".join(report.local_missing)
                + f", and docker: {report.docker_detail}"
            )
        provider = report.auto
    if provider == "local":
        from sandboxes.local import LocalBackend

        return LocalBackend(unsafe=unsafe, limits=limits, **options)
    if provider == "docker":
        from sandboxes.docker_pool import DockerBackend

        return DockerBackend(limits=limits, **options)
    if provider == "ray":
        from sandboxes.ray_pool import RayBackend

        return RayBackend(unsafe=unsafe, limits=limits, **options)
    raise ValueError(f"unknown sandbox provider {provider!r}; choose one of {', '.join(PROVIDERS)}")


def stats() -> dict[str, float]:
    """This process's pools' counters, summed over providers (``executions``, ``retries``, ``infra_errors``,
    ``respawns``, ``slot_wait_s``, ...): what the trainer reports per step as ``sandbox/<name>``."""
    with _backends_lock:
        backends = list(_backends.values())
    total: dict[str, float] = {}
    for backend in backends:
        counters = getattr(getattr(backend, "pool", None), "stats", None)
        for key, value in (counters if isinstance(counters, dict) else {}).items():
            total[key] = total.get(key, 0) + value
    return total


def shutdown() -> None:
    """Stop every shared pool of this process: all worker processes, cgroups and scratch dirs (also run at exit).

    Safe to call twice; a later `open` starts fresh pools.
    """
    with _backends_lock:
        backends = list(_backends.values())
        _backends.clear()
    for backend in backends:
        backend.close()


atexit.register(shutdown)


def reap(docker: bool = True) -> dict[str, int]:
    """Remove what sandboxes of dead processes on this host left behind (e.g. a run killed by SIGKILL, which no
    `atexit` outlives): their cgroups, unsafe scratch dirs and (when `docker` and an engine answers) containers.
    Each is tagged with its owner's pid and start time, so a reused pid keeps nothing alive. Every pool's start
    does this by itself; call it to clean up without starting one.

    Returns:
        How many were removed of each: {"cgroups": n, "scratch dirs": m, "containers": k}.
    """
    from sandboxes import local

    removed = {**local.reap(), "containers": 0}
    if docker:
        from sandboxes import docker_pool

        try:
            client = docker_pool._client()
        except SandboxUnavailable:  # no SDK or no engine: no containers to reap
            return removed
        try:
            removed["containers"] = docker_pool.reap_orphans(client)
        finally:
            client.close()
    return removed


def open(  # noqa: A001  (the issue's chosen name: sandboxes.open)
    provider: str = "auto",
    *,
    wall_s: float = 10.0,
    cpu_s: float | None = None,
    memory_mb: int = 1024,
    max_output_bytes: int = 65536,
    persistent: bool = False,
    unsafe: bool = False,
    **options: object,
) -> Sandbox:
    """Open a sandbox session; use as `async with sandboxes.open("local", wall_s=10) as sb:`.

    Nothing starts until the session is entered (or `start()`ed); the provider's pool is then shared by every
    session opened with the same provider and options in this process.

    Args:
        provider: "local" (bubblewrap jail pool), "docker", "ray", or "auto" (see `sandboxes.probe()`).
        wall_s: default wall-clock deadline of every call, in seconds (each call can override every limit).
        cpu_s: default CPU seconds of a call (None: `wall_s`).
        memory_mb: default address-space cap of a call's processes.
        max_output_bytes: default cap on a call's stdout + stderr.
        persistent: keep Python state across `run_python` calls (a REPL on a dedicated worker).
        unsafe: allow the local provider without isolation (rlimits only) where the host lacks it.
        **options: provider settings that shape the shared pool, e.g. workers=2, preload=("numpy",),
            site_packages=sandboxes.host_site_packages(), python="/usr/bin/python3", recycle_after=500;
            ray: actors=2, workers_per_actor=1.

    Returns:
        A `Sandbox` session, not yet started.

    Raises:
        ValueError: for an unknown provider, or a limit out of range (the message names it).
        SandboxUnavailable: when the session starts, if the provider cannot isolate code on this host (the
            message says what is missing).
    """
    if provider not in PROVIDERS:
        raise ValueError(f"unknown sandbox provider {provider!r}; choose one of {', '.join(PROVIDERS)}")
    limits = Limits(wall_s=wall_s, cpu_s=cpu_s, memory_mb=memory_mb, max_output_bytes=max_output_bytes)
    return Sandbox(provider, limits, persistent=persistent, unsafe=unsafe, options=dict(options))


class Sandbox:
    """One session (e.g. one episode), made by `sandboxes.open`. Calls never raise for the snippet's failures: they
    return a `Result` whose `status` says what happened. They raise only for caller mistakes (bad arguments) and, at
    start, for a provider this host cannot run.

    Attributes:
        provider: the provider's name once started ("local", "local-unsafe", "docker", "ray").
        limits: the session's default `Limits`.
        persistent: whether `run_python` calls share one REPL.
    """

    def __init__(self, provider: str, limits: Limits, *, persistent: bool, unsafe: bool, options: dict) -> None:
        self.provider = provider
        self.limits = limits
        self.persistent = persistent
        self._unsafe = unsafe
        self._options = options
        self._backend: Backend | None = None
        self._session: Session | None = None
        self._staged: dict[str, str] = {}
        self._closed = False

    async def __aenter__(self) -> Sandbox:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Start (or join) the provider's shared pool; in persistent mode also take a dedicated worker.

        Raises:
            SandboxUnavailable: when the provider cannot isolate code on this host (the message says what is missing).
        """
        if self._backend is not None:
            return
        if self.provider == "ray" and not _ray_running():
            # ray.init must run on the main thread (signal handlers, clean shutdown): this first
            # open blocks the loop while Ray starts. Call ray.init() yourself beforehand to avoid it.
            self._backend = _backend(self.provider, self._options, self._unsafe, self.limits)
        else:
            self._backend = await asyncio.to_thread(_backend, self.provider, self._options, self._unsafe, self.limits)
        self.provider = self._backend.name
        if self.persistent:
            self._session = await self._backend.open_session()

    async def close(self) -> None:
        """End the session: a persistent session's worker is released (its REPL state is gone); the pool stays warm."""
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()
        self._closed = True

    # ---- execution --------------------------------------------------------------------------
    async def run_python(
        self,
        code: str,
        *,
        stdin: bytes | str = b"",
        files: Mapping[str, bytes | str] | None = None,
        **limits: float | int | None,
    ) -> Result:
        """Run `code` as `python -c` would (in persistent mode: as the next REPL cell, whose last
        expression's repr is printed, as in a notebook).

        Args:
            code: the Python source.
            stdin: the snippet's standard input.
            files: {relative path: content} written into the work directory (the cwd) before it runs.
            **limits: per-call overrides of wall_s, cpu_s, memory_mb, max_output_bytes.

        Returns:
            The `Result`; a timeout, crash or limit is its `status`, never an exception.

        Raises:
            TypeError: if `code` is not a str, or for an unknown limit.
            ValueError: for a limit out of range, or a file path that is absolute or contains "..".
            SandboxError: if the session is not open.
        """
        if not isinstance(code, str):
            raise TypeError(f"code must be str, got {type(code).__name__}")
        if self.persistent:
            return await self._session_call({"op": "repl", "code": code, "files": self._files(files)}, None, limits)
        return await self._call("python", {"code": code, "stdin": _b64(stdin), "files": self._files(files)}, limits)

    async def exec(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | str = b"",
        files: Mapping[str, bytes | str] | None = None,
        **limits: float | int | None,
    ) -> Result:
        """Run a program (argv[0] looked up on the jail's PATH) with `stdin` as its standard input.

        Args:
            argv: the command line, e.g. ["sh", "-c", "ls /"].
            stdin: its standard input.
            files: {relative path: content} written into the work directory (its cwd) first.
            **limits: per-call overrides of wall_s, cpu_s, memory_mb, max_output_bytes.

        Returns:
            The `Result` (a program that cannot be executed exits 127, status "error").

        Raises:
            TypeError: if `argv` is not a non-empty list of str, or for an unknown limit.
            ValueError: for a limit out of range or a bad file path.
            SandboxError: if the session is not open.
        """
        if isinstance(argv, str) or not argv or not all(isinstance(a, str) for a in argv):
            raise TypeError(
                f"argv must be a non-empty list of str, got {argv!r}; for a shell line use ['sh', '-c', line]"
            )
        payload = {"argv": list(argv), "stdin": _b64(stdin), "files": self._files(files)}
        if self.persistent:
            return await self._session_call({"op": "exec"}, payload, limits)
        return await self._call("exec", payload, limits)

    async def upload(self, path: str, data: bytes | str) -> None:
        """Put a file into the work directory (the snippet's cwd). Without persistence the file is
        staged and written before every later call of this session.

        Args:
            path: relative to the work directory; missing directories are made.
            data: the content.

        Raises:
            ValueError: if `path` is absolute or contains "..".
            SandboxError: in a persistent session, if the worker cannot write it (e.g. a directory or FIFO there).
        """
        _check_relative(path)
        if self.persistent:
            reply = await self._require_session().call({"op": "put", "files": {path: _b64(data)}}, None, self.limits)
            if isinstance(reply, Result) or "error" in reply:  # a Result here: the worker failed (infra_error)
                raise SandboxError(reply.stderr if isinstance(reply, Result) else reply["error"])
        else:
            self._staged[path] = _b64(data)

    async def download(self, path: str) -> bytes:
        """Read a file from the work directory (persistent sessions only: otherwise it is wiped after each call).

        Args:
            path: relative to the work directory; must name a regular file (no symlink is followed).

        Returns:
            Its content (at most 48 MB).

        Raises:
            ValueError: if `path` is absolute or contains "..".
            SandboxError: without persistence, or if the file cannot be read (missing, not a regular file, too large).
        """
        _check_relative(path)
        if not self.persistent:
            raise SandboxError(
                f"download({path!r}) needs persistent=True: a one-shot call's files are wiped when it ends"
            )
        reply = await self._require_session().call({"op": "get", "path": path}, None, self.limits)
        if isinstance(reply, Result) or "error" in reply:
            raise SandboxError(reply.stderr if isinstance(reply, Result) else reply["error"])
        return base64.b64decode(reply["data"])

    # ---- internals --------------------------------------------------------------------------
    def _limits(self, overrides: dict) -> Limits:
        unknown = set(overrides) - {"wall_s", "cpu_s", "memory_mb", "max_output_bytes"}
        if unknown:
            raise TypeError(f"unknown limit(s) {sorted(unknown)}; use wall_s, cpu_s, memory_mb or max_output_bytes")
        return self.limits.replace(**overrides)

    def _files(self, files: Mapping[str, bytes | str] | None) -> dict[str, str]:
        merged = dict(self._staged)
        for path, data in (files or {}).items():
            _check_relative(path)
            merged[path] = _b64(data)
        return merged

    async def _call(self, op: str, payload: dict, overrides: dict) -> Result:
        if self._backend is None or self._closed:
            raise SandboxError("the sandbox is not open; use `async with sandboxes.open(...) as sb:`")
        limits = self._limits(overrides)
        return await self._backend.run({"op": op, "limits": limits.to_wire()}, payload, limits)

    async def _session_call(self, header: dict, payload: dict | None, overrides: dict) -> Result:
        limits = self._limits(overrides)
        reply = await self._require_session().call({**header, "limits": limits.to_wire()}, payload, limits)
        return reply if isinstance(reply, Result) else Result.from_wire(reply, self.provider)

    def _require_session(self) -> Session:
        if self._session is None or self._closed:
            raise SandboxError("the sandbox is not open; use `async with sandboxes.open(...) as sb:`")
        return self._session


def _b64(data: bytes | str) -> str:
    if isinstance(data, str):
        data = data.encode()
    if not isinstance(data, (bytes, bytearray)):
        raise TypeError(f"expected bytes or str, got {type(data).__name__}")
    return base64.b64encode(data).decode()


def _check_relative(path: str) -> None:
    parts = path.replace("\\", "/").split("/")
    if not path or path.startswith("/") or ".." in parts:
        raise ValueError(f"file path {path!r} must be relative to the work directory and must not contain '..'")


__all__ = ["Sandbox", "open", "reap", "shutdown"]
