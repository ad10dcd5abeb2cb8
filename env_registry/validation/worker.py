"""The validation worker: runs ``checks.run_checks`` inside the sandbox jail, on the package's own venv.

Started by ``jail`` through ``sandboxes`` (``run_python`` in the local jail, the venv's site-packages mounted
read-only on ``sys.path``; for a ChatAgent package the jail has a network namespace of its own with only a loopback
device, where the session server it is checked through listens). It reads ``{"nonce", "env_ids", "package"}`` from
stdin *before* importing anything of the package, and writes one line per event to stdout, each prefixed by the
nonce: ``{"step": ...}`` before a step, ``{"check": {...}}`` after each check, ``{"samples": {...}}`` with a split's first
prompts, ``{"done": true}`` at the end. Lines
without the nonce (the package's own prints) are ignored by the host.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict
from typing import Any


def main() -> int:
    args = json.loads(sys.stdin.read())
    out = os.dup(1)  # the package may swap sys.stdout; the events go to the original descriptor

    def emit(event: dict[str, Any]) -> None:
        os.write(out, (args["nonce"] + " " + json.dumps(event, default=str) + "\n").encode())

    from env_registry.validation.checks import run_checks

    run_checks(
        args["env_ids"],
        args["package"],
        lambda check: emit({"check": asdict(check)}),
        lambda step: emit({"step": step}),
        lambda env_id, split, prompts: emit({"samples": {"env_id": env_id, "split": split, "prompts": prompts}}),
    )
    emit({"done": True})
    return 0
