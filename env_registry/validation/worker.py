"""The validation worker: runs ``checks.run_checks`` inside the sandbox jail, on the package's own venv.

Started by ``jail`` through ``sandboxes`` (``run_python`` in the local jail, the venv's site-packages mounted
read-only on ``sys.path``; for a ChatAgent package the jail has a network namespace of its own with only a loopback
device, where the session server it is checked through listens). It reads ``{"nonce", "env_ids", "package"}`` from
stdin *before* importing anything of the package, and writes one line per event to stdout, each prefixed by the
nonce: ``{"step": ...}`` before a step, ``{"check": {...}}`` after each check, ``{"samples": {...}}`` with a split's first
prompts, ``{"calibration": {"env_id", "figures"}}`` after the reference eval of an env whose checks all passed (when
the host gave a ``reference`` policy, see ``calibration``), ``{"done": true}`` at the end. Lines without the nonce (the
package's own prints) are ignored by the host.
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

    failed: set[str | None] = set()

    def check(c: Any) -> None:
        if not c.passed:
            failed.add(c.env_id)
        emit({"check": asdict(c)})

    run_checks(
        args["env_ids"],
        args["package"],
        check,
        lambda step: emit({"step": step}),
        lambda env_id, split, prompts: emit({"samples": {"env_id": env_id, "split": split, "prompts": prompts}}),
    )
    if args.get("reference") and None not in failed:
        for env_id in args["env_ids"]:
            if env_id not in failed:
                emit({"step": f"{env_id}: reference eval"})
                emit({"calibration": {"env_id": env_id, "figures": _calibrate(env_id, args["reference"])}})
    emit({"done": True})
    return 0


def _calibrate(env_id: str, given: dict[str, Any]) -> dict[str, Any]:
    """The reference eval of ``env_id`` through the forwarders (``calibration``); an error as ``{"error"}``."""
    import asyncio

    from env_registry.validation.calibration import Reference, jail_forwarder, reference_eval

    given = dict(given)
    socket = given.pop("socket")
    reference = Reference(**given)

    async def run() -> dict[str, Any]:
        async with jail_forwarder(socket) as port:
            return await reference_eval(env_id, reference, reference.jail_url(port))

    try:
        return asyncio.run(run())
    except Exception as exc:
        return {"error": f"the reference eval failed: {type(exc).__name__}: {exc}", "policy": reference.label}
