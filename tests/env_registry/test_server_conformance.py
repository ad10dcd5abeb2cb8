"""``molt-env check URL [--protocol molt-env/1|openenv]``: the server conformance suite (``env_registry.serving.
server_check``) passes against our own ``molt-env serve-env`` processes, both protocols, and fails, by name, the checks
a deliberately broken server breaks."""

from __future__ import annotations

import re
import subprocess
import sys
import threading

import pytest
from packaging_support import run_cli

pytest.importorskip("openenv", reason="the openenv extra is part of [dev]")

READY = re.compile(r" at (http://\S+?)(?: \(|, )")
ROW = re.compile(r"^  (PASS|FAIL)  ([^:]+)", re.MULTILINE)


def verdicts(stdout: str) -> dict[str, str]:
    """The check name -> PASS/FAIL of the server report (the part after its header)."""
    server_part = stdout[stdout.index("server at ") :]
    return {name: verdict for verdict, name in ROW.findall(server_part)}


def _end(proc: subprocess.Popen) -> None:
    """A server started with ``--exit-on-stdin-eof`` (or reading its stdin): close it, then wait, else kill."""
    proc.stdin.close()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture(scope="module")
def serve():
    running: list[subprocess.Popen] = []

    def start(*args: str) -> str:
        cmd = [sys.executable, "-m", "env_registry.cli", "serve-env", *args, "--port", "0", "--exit-on-stdin-eof"]
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        running.append(proc)
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if match := READY.search(line):
                threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
                return match[1]
        raise AssertionError("the server did not start:\n" + "".join(lines))

    yield start
    for proc in running:
        _end(proc)


def test_our_molt_env_server_passes_every_check(serve):
    url = serve("molt/sort-v1")
    checked = run_cli("check", url, timeout=120)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    found = verdicts(checked.stdout)
    assert len(found) >= 15 and set(found.values()) == {"PASS"}, checked.stdout
    for name in ("episode (reset, step, close)", "concurrent episodes", "client dropped mid-episode"):
        assert found[name] == "PASS"
    assert "16 concurrent episodes completed" in checked.stdout
    assert "conformance report for molt/sort-v1" in checked.stdout  # the env-level checks still run for a URL


def test_our_openenv_server_passes_every_check_including_capacity(serve):
    url = serve("molt/sort-v1", "--protocol", "openenv", "--max-sessions", "3")
    checked = run_cli("check", url, "--protocol", "openenv", "--max-sessions", "3", timeout=120)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    found = verdicts(checked.stdout)
    assert len(found) >= 12 and set(found.values()) == {"PASS"}, checked.stdout
    assert "the next answered CAPACITY_REACHED" in checked.stdout
    assert "3 concurrent episodes completed" in checked.stdout


BROKEN = """
import json, sys
import uvicorn
from fastapi import FastAPI, WebSocket, WebSocketDisconnect
from molt_envs.remote.protocol import PROTOCOL

app = FastAPI()
ENV = "acme/broken-v1"

@app.get("/health")
def health():
    return {"status": "healthy", "protocol": PROTOCOL, "envs": [ENV]}

@app.get(f"/{ENV}/metadata")
def metadata():
    return {"protocol": PROTOCOL, "id": ENV, "kind": "env", "hash": "0" * 64, "spec": {"id": ENV}}

@app.get(f"/{ENV}/schema")
def schema():
    return {"protocol": "molt-env/0"}  # another version

@app.websocket(f"/{ENV}/ws")
async def molt_ws(ws: WebSocket):  # answers a reset, garbage to the rest, and drops the connection on a step
    await ws.accept()
    try:
        while True:
            raw = await ws.receive_text()
            try:
                kind = json.loads(raw).get("type")
            except ValueError:
                kind = None
            if kind == "reset":
                answer = {"observation": {"observation": "x", "label": None}, "reward": None, "done": False}
                await ws.send_text(json.dumps({"type": "observation", "data": answer}))
            elif kind == "step":
                await ws.close(code=1011)
                return
            else:
                await ws.send_text("garbage")
    except WebSocketDisconnect:
        pass

@app.get("/metadata")
def openenv_metadata():
    return {"name": "broken", "description": "a broken OpenEnv server"}

@app.websocket("/ws")
async def openenv_ws(ws: WebSocket):  # takes anything: every message is answered an observation
    await ws.accept()
    try:
        while True:
            await ws.receive_text()
            await ws.send_text(json.dumps({"type": "observation", "data": {"observation": {}, "reward": 0, "done": True}}))
    except WebSocketDisconnect:
        pass

config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", ws="websockets-sansio", lifespan="off")
server = uvicorn.Server(config)
import asyncio, threading
def watch():
    sys.stdin.read()
    server.should_exit = True
threading.Thread(target=watch, daemon=True).start()
async def main():
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    print(f"broken server at http://127.0.0.1:{port} (test)", flush=True)
    await task
asyncio.run(main())
"""


@pytest.fixture(scope="module")
def broken():
    proc = subprocess.Popen(
        [sys.executable, "-c", BROKEN],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    line = proc.stdout.readline()
    match = READY.search(line)
    if match is None:
        proc.kill()
        raise AssertionError(f"the broken server did not start: {line!r}{proc.stdout.read()}")
    threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
    yield match[1]
    _end(proc)


def test_a_broken_molt_env_server_fails_the_checks_it_breaks(broken):
    checked = run_cli("check", f"{broken}/acme/broken-v1", "--sessions", "4", timeout=120)
    assert checked.returncode == 1, checked.stdout + checked.stderr
    found = verdicts(checked.stdout)
    assert found["health"] == "PASS" and found["metadata"] == "PASS", checked.stdout
    for name in (
        "schema matches protocol.schema.json",
        "wrong protocol version refused",
        "episode (reset, step, close)",
        "malformed JSON answered INVALID_JSON",
        "unknown message type answered an error",
        "binary garbage answered an error",
        "concurrent episodes",
        "client dropped mid-episode",
    ):
        assert found[name] == "FAIL", (name, checked.stdout)
    assert "'molt-env/0'" in checked.stdout  # the detail says what was wrong


def test_a_broken_openenv_server_fails_the_checks_it_breaks(broken):
    checked = run_cli("check", broken, "--protocol", "openenv", "--sessions", "4", timeout=120)
    assert checked.returncode == 1, checked.stdout + checked.stderr
    found = verdicts(checked.stdout)
    assert found["health"] == "PASS" and found["metadata"] == "PASS", checked.stdout
    for name in (
        "schema",
        "malformed action answered VALIDATION_ERROR",
        "malformed JSON answered INVALID_JSON",
        "unknown message type answered UNKNOWN_TYPE",
    ):
        assert found[name] == "FAIL", (name, checked.stdout)


def test_server_options_need_a_url():
    checked = run_cli("check", "molt/sort-v1", "--protocol", "openenv")
    assert checked.returncode != 0 and "give its URL" in checked.stderr
