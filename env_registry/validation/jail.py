"""The jailed run of the validation worker, in a child process of its own.

``run_worker`` starts ``python -m env_registry.validation.jail`` (this module), which opens a ``sandboxes`` local
jail over the package's venv, runs the worker in it, prints the sandbox's result as JSON and exits: the jail's warm
pool (keyed by the venv, so never reused) ends with that process, whatever happened inside.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

JAIL_PYTHON = "/usr/bin/python3"  # the sandboxes' default interpreter; the venv is made of the same one
WORKER = "import sys\nfrom env_registry.validation.worker import main\nsys.exit(main())\n"
GRACE_S = 120.0  # the child's own start-up and the jail's, on top of the worker's wall limit


def run_worker(
    site: Path,
    stdin: str,
    timeout_s: float,
    memory_mb: int,
    loopback: bool,
    binds: tuple[tuple[str, str], ...] = (),
) -> dict[str, Any]:
    """The worker's sandbox result: ``status``, ``stdout``, ``stderr``, ``exit_code``, ``provider``; status
    ``unavailable`` (with ``detail``) when this host cannot isolate, ``infra_error`` when the child failed.
    ``loopback``: the jail gets a loopback device of its own (a ChatAgent's session server listens there).
    ``binds``: (host directory, jail path) pairs mounted read-only (the reference endpoint's unix socket)."""
    request = {
        "site": str(site),
        "stdin": stdin,
        "timeout_s": timeout_s,
        "memory_mb": memory_mb,
        "loopback": loopback,
        "binds": [list(pair) for pair in binds],
    }
    request = json.dumps(request)
    cmd = [sys.executable, "-m", "env_registry.validation.jail"]
    try:
        proc = subprocess.run(cmd, input=request, capture_output=True, text=True, timeout=timeout_s + GRACE_S)
    except subprocess.TimeoutExpired:
        return {
            "status": "infra_error",
            "stdout": "",
            "stderr": f"the jail's host process ran past {timeout_s + GRACE_S:g} s",
        }
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"status": "infra_error", "stdout": "", "stderr": (proc.stdout + proc.stderr)[-3000:]}


async def _serve(request: dict[str, Any]) -> dict[str, Any]:
    import sandboxes

    try:
        async with sandboxes.open(
            "local",
            wall_s=request["timeout_s"],
            memory_mb=request["memory_mb"],
            max_output_bytes=8 << 20,
            workers=1,
            site_packages=(request["site"],),
            python=JAIL_PYTHON,
            network="loopback" if request["loopback"] else "none",
            **({"binds": tuple(tuple(pair) for pair in request["binds"])} if request.get("binds") else {}),
        ) as sb:
            result = await sb.run_python(WORKER, stdin=request["stdin"])
    except sandboxes.SandboxUnavailable as exc:
        return {"status": "unavailable", "detail": str(exc), "stdout": "", "stderr": ""}
    return {
        "status": result.status,
        "stdout": result.stdout,
        "stderr": result.stderr,
        "exit_code": result.exit_code,
        "provider": sb.provider,
    }


if __name__ == "__main__":
    outcome = asyncio.run(_serve(json.loads(sys.stdin.read())))
    print(json.dumps(outcome))
