"""The verifiers venv the verifiers tests share, and the scripted OpenAI-compatible endpoint they evaluate against.

The venv (one per test session: conftest registers ``vf_venv``): made by
``molt-env ecosystem install verifiers --with`` a small taskset package written here (``vfx_arith``, against
``verifiers.v1``), in a tmp ``MOLT_CACHE`` set for the session so every process started by the tests finds it. Its
runtime wheel, built from this checkout, also brings ``molt_verifiers`` (our IDs as a verifiers taskset)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

MOLT_ENV = str(Path(sys.executable).with_name("molt-env"))
ID = "verifiers:vfx_arith"
TASKSET = '''
"""Add two numbers: a verifiers v1 taskset with a train and a test split."""

import verifiers.v1 as vf


class ArithData(vf.TaskData):
    answer: str


class ArithTask(vf.Task[ArithData]):
    @vf.reward(weight=0.8)
    async def exact(self, trace: vf.Trace) -> float:
        return float(trace.last_reply.strip() == self.data.answer)

    @vf.reward(weight=0.2)
    async def digits(self, trace: vf.Trace) -> float:
        reply = trace.last_reply.strip()
        return sum(c.isdigit() for c in reply) / len(reply) if reply else 0.0

    @vf.metric
    async def reply_chars(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply.strip()))


class ArithConfig(vf.TasksetConfig):
    split: str = "train"
    num_tasks: int = 4


class ArithTaskset(vf.Taskset[ArithTask, ArithConfig]):
    def load(self):
        base = 0 if self.config.split == "train" else 100
        for i in range(self.config.num_tasks):
            a, b = base + i, 2 * i + 1
            data = ArithData(prompt=f"What is {a}+{b}? Reply with the number only.", answer=str(a + b))
            yield ArithTask(data, self.config.task)


__all__ = ["ArithTaskset"]
'''
PYPROJECT = """
[project]
name = "vfx-arith"
version = "0.1.0"
description = "Add two numbers."
requires-python = ">=3.11"
dependencies = ["verifiers"]

[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"
"""


@pytest.fixture(scope="session")
def vf_venv(tmp_path_factory):
    """``molt-env ecosystem install verifiers --with <the taskset package>`` into a tmp ``MOLT_CACHE`` (set for the
    session, so every process started here finds the venv)."""
    package = tmp_path_factory.mktemp("vfx-arith")
    (package / "pyproject.toml").write_text(PYPROJECT)
    (package / "vfx_arith").mkdir()
    (package / "vfx_arith" / "__init__.py").write_text(TASKSET)
    cache = tmp_path_factory.mktemp("molt-cache")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("MOLT_CACHE", str(cache))
        start = time.monotonic()
        made = subprocess.run(
            [MOLT_ENV, "ecosystem", "install", "verifiers", "--with", str(package)],
            capture_output=True,
            text=True,
            timeout=900,
        )
        seconds = time.monotonic() - start
        assert made.returncode == 0, made.stderr[-3000:]
        print(f"\nthe verifiers venv took {seconds:.1f} s: {made.stdout.strip()}")
        assert f"tasksets: {ID}" in made.stdout
        yield cache / "ecosystems" / "verifiers" / "venv"


class ScriptedChat(BaseHTTPRequestHandler):
    """An OpenAI-compatible endpoint (plain and streamed Chat Completions) whose reply to a request is
    ``reply(said)``, ``said`` the request's messages' contents joined; a subclass scripts it (``asked`` and ``lock``
    are there for counting requests) and sets the ``usage`` it reports."""

    usage = {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
    asked: Counter
    lock = threading.Lock()

    def reply(self, said: str) -> str:
        raise NotImplementedError

    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        text = self.reply(" ".join(str(m.get("content")) for m in body["messages"]))
        head = {"id": "c", "created": 0, "model": body["model"]}
        if body.get("stream"):
            chunks = [
                {"choices": [{"index": 0, "delta": {"role": "assistant", "content": text}, "finish_reason": None}]},
                {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
                {"choices": [], "usage": self.usage},
            ]
            data = "".join(f"data: {json.dumps({**head, 'object': 'chat.completion.chunk', **c})}\n\n" for c in chunks)
            self._send(data + "data: [DONE]\n\n", "text/event-stream")
        else:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
            reply = {**head, "object": "chat.completion", "usage": self.usage, "choices": [choice]}
            self._send(json.dumps(reply), "application/json")

    def _send(self, text: str, content_type: str) -> None:
        data = text.encode()
        self.send_response(200)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def serve_scripted(handler: type[ScriptedChat]) -> Iterator[str]:
    """Serve ``handler`` on a free loopback port (its ``asked`` cleared); yields the ``/v1`` base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    handler.asked.clear()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()
