"""Helpers of the eval tests: ``molt-train serve`` on a tiny checkpoint, ``molt-env eval`` as a real process."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
MOLT_ENV = str(Path(sys.executable).with_name("molt-env"))
MOLT_TRAIN = str(Path(sys.executable).with_name("molt-train"))


def cli_env(**extra: str) -> dict[str, str]:
    """The environment of a ``molt-env`` process: ``eval_envs`` importable, no registry settings."""
    env = {k: v for k, v in os.environ.items() if k not in ("MOLT_REGISTRY", "MOLT_TOKEN", "MOLT_TEST_FLIP")}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return {**env, **extra}


def molt_env(*args: str, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([MOLT_ENV, *args], capture_output=True, text=True, env=cli_env(**env), timeout=timeout)


def serve(model_dir: Path, *extra: str) -> tuple[str, subprocess.Popen]:
    """``molt-train serve`` on a free port; returns its root URL and the process."""
    proc = subprocess.Popen(
        [MOLT_TRAIN, "serve", "--model", str(model_dir), "--port", "0", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 180
    lines = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        lines.append(line)
        match = re.search(r"session server on (http://\S+) ", line)
        if match:
            return match[1], proc
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise RuntimeError("molt-train serve did not start:\n" + "".join(lines))


def stop(proc: subprocess.Popen) -> None:
    if proc.stdout is not None:
        proc.stdout.close()
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def samples(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines() if line.strip()]


def summary(out: Path, name: str = "summary.json") -> dict:
    return json.loads((out / name).read_text())


@contextlib.contextmanager
def front(endpoint: str, answer):
    """A proxy in front of ``endpoint`` on a free port (yields its URL): ``answer(path, body)`` returns
    ``(status, json)`` to answer a request itself, or None to pass it on (session URLs are rewritten to the front)."""
    import threading

    import httpx
    import uvicorn
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    url: list[str] = []

    async def route(request):
        body = await request.body()
        own = answer(request.url.path, body)
        if own is not None:
            return JSONResponse(own[1], status_code=own[0])
        async with httpx.AsyncClient(timeout=None) as client:
            reply = await client.request(
                request.method, endpoint + request.url.path, content=body, headers={"content-type": "application/json"}
            )
        content = reply.content.replace(endpoint.encode(), url[0].encode())
        return Response(content, status_code=reply.status_code, media_type="application/json")

    app = Starlette(routes=[Route("/{path:path}", route, methods=["GET", "POST", "DELETE"])])
    server = uvicorn.Server(uvicorn.Config(app, port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    url.append(f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}")
    try:
        yield url[0]
    finally:
        server.should_exit = True
        thread.join(10)
