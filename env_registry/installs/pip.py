"""pip, as both kinds of install run it: into this interpreter, another one, or a venv without pip of its own."""

from __future__ import annotations

import subprocess
import sys

from env_registry.errors import InstallError

PIP_TIMEOUT_S = 900


def pip_install(requirements: list[str], what: str, python: str | None = None, into: str | None = None) -> None:
    """``python -m pip install REQUIREMENTS`` (``python``: this interpreter by default; ``into``: the interpreter
    of a venv without pip of its own, which this pip installs into); raises ``InstallError`` naming ``what``."""
    # into a fresh venv: no byte-compiling (a third of pip's time there; Python compiles on first import instead)
    cmd = [
        python or sys.executable,
        "-m",
        "pip",
        *(["--python", into, "install", "--no-compile"] if into else ["install"]),
    ]
    cmd += ["--disable-pip-version-check", "--no-input", *requirements]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    except FileNotFoundError:
        raise InstallError(f"python interpreter {cmd[0]!r} not found; pass --python /path/to/bin/python") from None
    except subprocess.TimeoutExpired:
        raise InstallError(f"installing {what}: `{' '.join(cmd)}` took longer than {PIP_TIMEOUT_S} s") from None
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-20:]
        raise InstallError(f"installing {what}: `{' '.join(cmd)}` failed (exit {proc.returncode}):\n" + "\n".join(tail))
