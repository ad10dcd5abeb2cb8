"""A checkpoint as the reference policy (``--reference-checkpoint PATH``): checked, hashed and served by the operator.

``checkpoint_stamp(path)`` checks that ``path`` is a Hugging Face checkpoint (a ``save_pretrained`` directory:
``config.json``, weights, a tokenizer) and returns what a calibration is stamped with: the resolved path and a
sha256 over the files that define the model (config, weights, tokenizer; not a trainer's optimizer or RNG state), so
two calibrations by the same name but other weights differ. ``ServedCheckpoint`` serves it as ``molt-train serve
--model PATH --port 0`` (a child process of the operator's: ``env_registry`` never imports ``molt_train``, see the
import-linter layers) and yields its OpenAI base URL, which the existing endpoint path (``HostForwarder`` into the
jail, ``EndpointPolicy``'s session mode) then uses unchanged; leaving the block stops it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from env_registry.errors import Error

START_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 30.0
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
MODEL_SUFFIXES = WEIGHT_SUFFIXES + (".json", ".txt", ".model", ".jinja", ".tiktoken", ".py")
TRAINER_STATE = ("optimizer", "scheduler", "rng_state", "trainer_state", "training_args", "scaler")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt")
READY = re.compile(r"session server on (http://\S+) ")
HELP = "give a directory saved by save_pretrained (config.json, weights *.safetensors or *.bin, a tokenizer)"


def model_files(path: Path) -> list[Path]:
    """The files that define the model in a checkpoint directory (sorted): config, weights, tokenizer, chat template."""
    return sorted(
        p
        for p in path.iterdir()
        if p.is_file()
        and not p.name.startswith(".")
        and p.suffix in MODEL_SUFFIXES
        and not p.name.startswith(TRAINER_STATE)
    )


def checkpoint_stamp(path: str | Path) -> str:
    """``"<resolved path> sha256:<hex>"`` for a Hugging Face checkpoint directory.

    Raises:
        Error: ``path`` is no such directory, or lacks ``config.json`` (valid JSON with a ``model_type``), weights
            or a tokenizer; the message names the path and what to give instead.
    """
    where = Path(path).expanduser()
    if not where.is_dir():
        raise Error(f"--reference-checkpoint {str(path)!r} is not a directory; {HELP}")
    config = where / "config.json"
    try:
        model_type = json.loads(config.read_text()).get("model_type")
    except (OSError, ValueError, AttributeError) as exc:
        raise Error(
            f"--reference-checkpoint {str(path)!r} is no Hugging Face checkpoint: config.json: {exc}; {HELP}"
        ) from None
    if not model_type:
        raise Error(f"--reference-checkpoint {str(path)!r}: its config.json names no model_type; {HELP}")
    files = model_files(where)
    if not any(p.suffix in WEIGHT_SUFFIXES for p in files):
        raise Error(f"--reference-checkpoint {str(path)!r} holds no weights (*.safetensors, *.bin); {HELP}")
    if not any(p.name in TOKENIZER_FILES for p in files):
        raise Error(f"--reference-checkpoint {str(path)!r} holds no tokenizer (tokenizer.json, ...); {HELP}")
    digest = hashlib.sha256()
    for p in files:
        digest.update(p.name.encode() + b"\0")
        with p.open("rb") as f:
            digest.update(hashlib.file_digest(f, "sha256").digest())
    return f"{where.resolve()} sha256:{digest.hexdigest()}"


def serve_command() -> list[str]:
    """How to start ``molt-train serve`` here: this interpreter's ``molt_train``, else ``molt-train`` on PATH.

    Raises:
        Error: neither is installed.
    """
    if importlib.util.find_spec("molt_train") is not None:
        return [sys.executable, "-m", "molt_train.cli", "serve"]
    found = shutil.which("molt-train")
    if found:
        return [found, "serve"]
    raise Error(
        "--reference-checkpoint is served by molt-train serve, which is not installed here: "
        "pip install 'molt-ecosystem[train]', or serve the checkpoint yourself and give --reference-endpoint"
    )


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """The served checkpoint ends with the operator's process even if that one is killed outright (Linux)."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class ServedCheckpoint:
    """``molt-train serve`` over a checkpoint while the block runs; ``url`` is its OpenAI base URL (``.../v1``).

    Args:
        path: the checkpoint directory (checked by ``checkpoint_stamp`` first).
        stamp: its ``checkpoint_stamp`` where the caller already has it.
        max_new_tokens: the server's default completion length.
        timeout_s: how long the model may take to load.
    """

    def __init__(
        self, path: str | Path, max_new_tokens: int = 256, timeout_s: float = START_TIMEOUT_S, stamp: str = ""
    ) -> None:
        self.path = str(path)
        self.stamp = stamp or checkpoint_stamp(path)
        self.max_new_tokens = max_new_tokens
        self.timeout_s = timeout_s
        self.url = ""
        self.process: subprocess.Popen[str] | None = None

    def __enter__(self) -> ServedCheckpoint:
        cmd = serve_command() + ["--model", self.stamp.rsplit(" sha256:", 1)[0], "--port", "0"]
        cmd += ["--max-tokens", str(self.max_new_tokens)]
        self.process = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,  # noqa: PLW1509
        )
        lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=_drain, args=(self.process, lines), daemon=True).start()
        deadline = time.monotonic() + self.timeout_s
        seen: list[str] = []
        while time.monotonic() < deadline:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if line is None:
                break
            seen.append(line)
            match = READY.search(line)
            if match:
                self.url = match[1].rstrip("/") + "/v1"
                return self
        self.__exit__()
        tail = "".join(seen[-20:]).strip() or "(no output)"
        raise Error(f"--reference-checkpoint {self.path!r}: molt-train serve did not start serving it:\n{tail}")

    def __exit__(self, *exc: object) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _drain(process: subprocess.Popen[str], lines: queue.Queue[str | None]) -> None:
    """Read the server's output to its end (so it never blocks on a full pipe); the first lines go to ``lines``."""
    assert process.stdout is not None
    for line in process.stdout:
        if lines.qsize() < 1000:
            lines.put(line)
    lines.put(None)
