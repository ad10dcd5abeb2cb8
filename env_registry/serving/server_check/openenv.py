"""The ``openenv`` checks (OpenEnv's ``/ws`` wire): ``/health``, ``/metadata``, ``/schema``, an episode through
OpenEnv's own ``GenericEnvClient`` (the action built from the server's action schema), a malformed action answered
``VALIDATION_ERROR``, malformed JSON / an unknown message type answered with an error, ``CAPACITY_REACHED`` past
``max_sessions`` (when given: OpenEnv servers do not publish it), and the shared checks of ``common``."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

from env_registry.serving.server_check.common import (
    MAX_TURNS,
    Check,
    Outcome,
    Target,
    Wire,
    concurrent,
    dropped_client,
    get_json,
    idle_session,
    malformed_json,
    oversized,
    refused_with,
    step_before_reset,
    why,
)


def _action(target: Target) -> dict[str, Any]:
    """A scripted action from the server's action schema: each required field a value of its type; with none
    required, the first string field set to ``"0"``."""
    schema = (target.facts.get("schema") or {}).get("action") or {}
    props: dict[str, Any] = schema.get("properties") or {}
    typed = {"string": "0", "integer": 0, "number": 0.0, "boolean": False, "array": [], "object": {}}
    action = {name: typed.get(props.get(name, {}).get("type"), "0") for name in schema.get("required") or []}
    if not action:
        first = next((n for n, p in props.items() if p.get("type") == "string" and n != "metadata"), None)
        if first is not None:
            action[first] = "0"
    return action


def _client(target: Target) -> Any:
    from openenv.core.generic_client import GenericEnvClient

    return GenericEnvClient(base_url=target.http, message_timeout_s=target.timeout_s)


async def _reset(client: Any, seed: int, wait_s: float = 5.0) -> Any:
    """``reset``, asking again for ``wait_s`` while the server is at capacity (a session just closed elsewhere may
    take a moment to be released)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            await client.connect()
            return await client.reset(seed=seed)
        except Exception as exc:
            if "CAPACITY_REACHED" not in str(exc) or time.monotonic() > deadline:
                raise
            await client.disconnect()
            await asyncio.sleep(0.1)


async def _episode(target: Target, seed: int = 0) -> int:
    turns = 0
    async with _client(target) as client:
        await _reset(client, seed)
        for _ in range(MAX_TURNS):
            result = await client.step(_action(target))
            turns += 1
            if result.done:
                break
    return turns


WIRE = Wire(
    ws_url=lambda target, query: "ws" + target.http[len("http") :] + "/ws" + (f"?{query}" if query else ""),
    reset_frame=lambda target: json.dumps({"type": "reset", "data": {"seed": 0}}),
    step_frame=lambda target: json.dumps({"type": "step", "data": _action(target)}),
    oversized_step=lambda target, pad: json.dumps({"type": "step", "data": {"message": pad}}),
    episode=_episode,
    resets_before_step=True,
)


async def _health(target: Target) -> Outcome:
    health = await get_json(target, "/health")
    status = health.get("status") if isinstance(health, dict) else None
    return status == "healthy", f"status {status!r}"


async def _metadata(target: Target) -> Outcome:
    from openenv.core.env_server.types import EnvironmentMetadata

    metadata = EnvironmentMetadata.model_validate(await get_json(target, "/metadata"))
    return True, f"{metadata.name} {metadata.version or ''}".strip()


async def _schema(target: Target) -> Outcome:
    schema = await get_json(target, "/schema")
    missing = [k for k in ("action", "observation", "state") if not isinstance(schema.get(k), dict)]
    if missing:
        return False, f"/schema lacks the JSON schema of {missing}"
    target.facts["schema"] = schema
    fields = sorted(schema["action"].get("properties") or {})
    return True, f"action fields {fields}"


async def _episode_check(target: Target) -> Outcome:
    turns = await _episode(target)
    return True, f"reset, {turns} step(s), close (OpenEnv's GenericEnvClient)"


async def capacity(target: Target) -> Outcome:
    """``max_sessions`` sessions open, the next one answered ``CAPACITY_REACHED``."""
    clients = [_client(target) for _ in range(target.max_sessions + 1)]
    try:
        for i, client in enumerate(clients[:-1]):
            await _reset(client, i)
        try:
            await clients[-1].connect()
            await clients[-1].reset(seed=0)
        except Exception as exc:
            if "CAPACITY_REACHED" in str(exc):
                return True, f"{target.max_sessions} sessions open, the next answered CAPACITY_REACHED"
            return False, f"session {target.max_sessions + 1} failed otherwise: {why(exc)}"
        return False, f"session {target.max_sessions + 1} was accepted past max_sessions={target.max_sessions}"
    finally:
        for client in clients:
            with contextlib.suppress(Exception):
                await client.close()


CHECKS: list[tuple[str, Check]] = [
    ("health", _health),
    ("metadata", _metadata),
    ("schema", _schema),
    ("episode over /ws (reset, step, close)", _episode_check),
    (
        "malformed action answered VALIDATION_ERROR",
        refused_with(
            [json.dumps({"type": "step", "data": {"molt_check_unknown_field": 1}})],
            ("VALIDATION_ERROR",),
            "a malformed action",
            after_reset=True,
        ),
    ),
    ("malformed JSON answered INVALID_JSON", malformed_json),
    (
        "unknown message type answered UNKNOWN_TYPE",
        refused_with(
            [json.dumps({"type": "molt-check-explode", "data": {}})], ("UNKNOWN_TYPE",), "an unknown message type"
        ),
    ),
    ("step before reset", step_before_reset),
    ("concurrent sessions", concurrent),
    ("CAPACITY_REACHED past max sessions", capacity),
    ("idle session still answers", idle_session),
    ("client dropped mid-episode", dropped_client),
    ("oversized message refused", oversized),
]
