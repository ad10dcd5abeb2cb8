"""Helpers of the eval tests: ``molt-train serve`` on a tiny checkpoint, ``molt-env eval`` as a real process."""

from __future__ import annotations

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
