"""The validation worker: runs ``checks.run_checks`` inside the sandbox jail, on the package's own venv.

Started by ``validate`` through ``sandboxes`` (``run_python`` in the local jail, the venv's site-packages mounted
read-only on ``sys.path``). It reads ``{"nonce", "env_ids", "package", "chat"}`` from stdin *before* importing anything of
the package, and writes one line per event to stdout, each prefixed by the nonce: ``{"step": ...}`` before a step,
``{"check": {...}}`` after each check, ``{"done": true}`` at the end. Lines without the nonce (the package's own
prints) are ignored by the host.

The jail allows no TCP (seccomp, Landlock), but a ``ChatAgent`` talks to the session server over HTTP through its
SDK. So in here every ``SessionServer`` listens on a Unix socket of its own under the jail's ``/tmp``, and every
httpx/httpx2 transport (what the SDKs use) sends a request for such a server's host name to its socket; any other host is
a connection error (the jail has no network).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import itertools
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

HTTP_LIBRARIES = ("httpx", "httpx2")  # httpx2: what openai>=3 and anthropic>=2 use
SOCKETS: dict[str, str] = {}  # session server host name -> its Unix socket
_NUMBERS = itertools.count()


def route_http_to_unix_sockets() -> None:
    """Serve every ``SessionServer`` on a Unix socket and route httpx requests for it there."""
    import uvicorn

    from molt_envs.session_server import SessionServer

    socket_dir = tempfile.mkdtemp(prefix="molt-sockets-")

    class InLoopServer(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    async def start_on_unix_socket(self: SessionServer) -> str:
        if self._task is not None:
            return self.url
        number = next(_NUMBERS)
        host, path = f"session-{number}.molt-validate", os.path.join(socket_dir, f"{number}.sock")
        SOCKETS[host] = path
        config = uvicorn.Config(self.app, uds=path, log_level="warning", lifespan="off", access_log=False)
        self._server = InLoopServer(config)
        self._task = asyncio.get_running_loop().create_task(self._server.serve())
        while not self._server.started:
            if self._task.done():
                raise RuntimeError(f"the session server failed to start on {path}: {self._task.exception()!r}")
            await asyncio.sleep(0.005)
        self.url = f"http://{host}"
        return self.url

    SessionServer.start = start_on_unix_socket

    for name in HTTP_LIBRARIES:
        try:
            library = importlib.import_module(name)
        except ImportError:
            continue
        _route(library, library.AsyncHTTPTransport, "handle_async_request")
        _route(library, library.HTTPTransport, "handle_request")


def _route(library: Any, cls: type, method: str) -> None:
    """Make ``cls.<method>`` send each request to the Unix socket of its host's session server."""
    original = getattr(cls, method)

    def direct(transport: Any, request: Any) -> Any:
        if getattr(transport, "_molt_direct", False):
            return transport
        path = SOCKETS.get(request.url.host)
        if path is None:
            raise library.ConnectError(f"the validation jail has no network ({request.url})", request=request)
        cache = transport.__dict__.setdefault("_molt_unix", {})
        if path not in cache:
            cache[path] = cls(uds=path)
            cache[path]._molt_direct = True
        return cache[path]

    if method == "handle_async_request":

        async def handle(self: Any, request: Any) -> Any:
            return await original(direct(self, request), request)

    else:

        def handle(self: Any, request: Any) -> Any:
            return original(direct(self, request), request)

    setattr(cls, method, handle)


def main() -> int:
    args = json.loads(sys.stdin.read())
    out = os.dup(1)  # the package may swap sys.stdout; the events go to the original descriptor

    def emit(event: dict[str, Any]) -> None:
        os.write(out, (args["nonce"] + " " + json.dumps(event, default=str) + "\n").encode())

    if args.get("chat"):
        route_http_to_unix_sockets()
    from env_registry.validation.checks import run_checks

    run_checks(
        args["env_ids"],
        args["package"],
        lambda check: emit({"check": asdict(check)}),
        lambda step: emit({"step": step}),
    )
    emit({"done": True})
    return 0
