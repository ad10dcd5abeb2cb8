"""``molt-env eval --model DIR``: serve a local checkpoint with ``molt-train serve`` on a free loopback port.

The registry layer never imports the trainer: the checkpoint is served by the ``molt-train serve`` process (hf
engine, or ``--engine vllm`` on a GPU), and the eval goes through its endpoint like any other, one session per
sample. The process is stopped when the eval ends, however it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from env_registry.errors import Error

START_TIMEOUT_S = {"hf": 300.0, "vllm": 900.0}
_READY = re.compile(r"session server on (http://\S+) ")


def check_checkpoint(model: str | Path) -> Path:
    """The directory of a transformers checkpoint (``config.json`` and a tokenizer).

    Raises:
        Error: ``model`` is missing, not a directory, or not a checkpoint, saying what it lacks.
    """
    path = Path(model).expanduser()
    if not path.is_dir():
        raise Error(f"--model {str(model)!r} is not a directory; give a checkpoint directory (save_pretrained)")
    if not (path / "config.json").is_file():
        raise Error(
            f"--model {str(model)!r} is not a model checkpoint: it has no config.json. Give the directory a "
            "checkpoint was saved to (e.g. runs/<name>/hf after molt-train rl), or serve the model yourself and "
            "pass --base-url"
        )
    if not any((path / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        raise Error(f"--model {str(model)!r} has no tokenizer files (tokenizer.json / tokenizer_config.json)")
    return path.resolve()


def serve_command() -> list[str]:
    """``molt-train``, next to this interpreter or on PATH."""
    beside = Path(sys.executable).with_name("molt-train")
    found = str(beside) if beside.is_file() else shutil.which("molt-train")
    if found is None:
        raise Error(
            "--model needs the trainer's `molt-train serve` (pip install 'molt-ecosystem[train]'), or serve the "
            "model yourself and pass --base-url"
        )
    return [found, "serve"]


@contextlib.asynccontextmanager
async def served(model: str | Path, engine: str = "hf", extra: Sequence[str] = ()) -> AsyncIterator[str]:
    """Serve ``model`` for the duration of the block; yields the server's root URL.

    Raises:
        Error: the checkpoint is not one, ``molt-train`` is missing, or the server failed to start (its output
            tail is in the message).
    """
    path = check_checkpoint(model)
    cmd = [*serve_command(), "--model", str(path), "--engine", engine, "--port", "0", "--host", "127.0.0.1", *extra]
    proc = await asyncio.create_subprocess_exec(
        *cmd,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    lines: list[str] = []
    try:
        url = await asyncio.wait_for(_ready(proc, lines), START_TIMEOUT_S.get(engine, 600.0))
    except TimeoutError:
        await _stop(proc)
        raise Error(
            f"`{' '.join(cmd)}` did not start within {START_TIMEOUT_S.get(engine)} s:\n{_tail(lines)}"
        ) from None
    if url is None:
        await _stop(proc)
        raise Error(f"`{' '.join(cmd)}` exited with {proc.returncode} before serving:\n{_tail(lines)}")
    drain = asyncio.create_task(_drain(proc))
    try:
        yield url
    finally:
        drain.cancel()
        await _stop(proc)


async def _ready(proc: asyncio.subprocess.Process, lines: list[str]) -> str | None:
    while True:
        raw = await proc.stdout.readline()
        if not raw:
            await proc.wait()
            return None
        line = raw.decode(errors="replace").rstrip()
        lines.append(line)
        match = _READY.search(line)
        if match:
            return match[1]


async def _drain(proc: asyncio.subprocess.Process) -> None:
    """Keep reading the server's output so a chatty server never blocks on a full pipe."""
    while await proc.stdout.readline():
        pass


async def _stop(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 30)
        except TimeoutError:
            proc.kill()
            await proc.wait()


def _tail(lines: list[str]) -> str:
    return "\n".join(lines[-25:]) or "(no output)"
