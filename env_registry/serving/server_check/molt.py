"""The ``molt-env/1`` checks (``molt_envs.remote.protocol``): ``/health``, ``/<id>/metadata`` and ``/<id>/schema``
valid and of this protocol version (the schema compared with ``protocol.schema.json``), a dataset split streamed to
its end, an episode through our own client (``RemoteEnv``), a wrong protocol version and an unknown env ID refused,
garbage answered with protocol errors, and the shared checks of ``common``."""

from __future__ import annotations

import asyncio
import json
from importlib import resources
from typing import Any
from urllib.parse import quote

from env_registry.serving.server_check.common import (
    HTTP_TIMEOUT_S,
    MAX_TURNS,
    Check,
    Fail,
    Outcome,
    Target,
    Wire,
    answer,
    close_code,
    concurrent,
    connect,
    dropped_client,
    error_code,
    get_json,
    idle_session,
    malformed_json,
    oversized,
    refused_with,
    step_before_reset,
)

REFUSAL_WAIT_S = 3.0  # how long a server may take to refuse a protocol version it does not speak


def _ws_url(target: Target, query: str) -> str:
    from molt_envs.remote.protocol import PROTOCOL_VERSION

    return f"ws{target.base[len('http') :]}/{quote(target.path)}/ws?protocol={query or PROTOCOL_VERSION}"


def _reset_state(target: Target) -> dict[str, Any]:
    row = target.facts.get("row") or {"prompt": "conformance check", "label": None}
    return {"observation": row.get("prompt"), "label": row.get("label"), "images": []}


def _step_data(target: Target, turn: int) -> dict[str, Any]:
    row = target.facts.get("row") or {}
    label = row.get("label")
    return {
        "observation_text": str(row.get("prompt", "")),
        "action_text": label if isinstance(label, str) else "0",  # a scripted reply; its reward does not matter
        "label": label,
        "sampling_params": {},
        "turn": turn,
        "images": [],
    }


async def _episode(target: Target, seed: int = 0) -> int:
    """reset -> step ... -> close through ``RemoteEnv``; returns the steps taken (raises on any failure). Every
    episode plays the same row: ``seed`` only tells concurrent ones apart."""
    from molt_envs.contract import SamplingParams
    from molt_envs.remote.client import Endpoint, RemoteEnv

    metadata = target.facts.get("metadata")
    if metadata is not None and metadata.kind == "chat_agent":
        raise Fail("a chat agent's episode is a 'run' that calls a policy server; this suite cannot script one")
    env = RemoteEnv(Endpoint(target.base, target.path, timeout_s=target.timeout_s))
    state = await env.reset(_reset_state(target))
    if "observation" not in state:
        raise Fail(f"reset answered a state without an observation: {state!r:.120}")
    turns = 0
    try:
        for turn in range(MAX_TURNS):
            data = _step_data(target, turn)
            data["sampling_params"] = SamplingParams()
            result = await env.step(data)
            turns += 1
            if result.terminated or result.truncated:
                break
    finally:
        await env.close()
    return turns


WIRE = Wire(
    ws_url=_ws_url,
    reset_frame=lambda target: json.dumps({"type": "reset", "data": _reset_state(target)}),
    step_frame=lambda target: json.dumps({"type": "step", "data": _step_data(target, 0)}),
    oversized_step=lambda target, pad: json.dumps(
        {"type": "step", "data": {**_step_data(target, 0), "action_text": pad}}
    ),
    episode=_episode,
    resets_before_step=False,
)


async def _health(target: Target) -> Outcome:
    from molt_envs.remote.protocol import PROTOCOL, Health

    health = Health.model_validate(await get_json(target, "/health", target.base))  # the server's, at its root
    if health.protocol != PROTOCOL:
        return False, f"/health says protocol {health.protocol!r}, this suite checks {PROTOCOL!r}"
    if target.path not in health.envs:
        return False, f"/health lists {health.envs}, not {target.path!r}"
    return True, f"{health.status}, {PROTOCOL}, serves {', '.join(health.envs)}"


async def _metadata(target: Target) -> Outcome:
    from molt_envs.remote.protocol import PROTOCOL, Metadata

    metadata = Metadata.model_validate(await get_json(target, "/metadata"))
    if metadata.id != target.path or metadata.protocol != PROTOCOL:
        return False, f"answered the metadata of {metadata.id!r} ({metadata.protocol}) for {target.path!r}"
    target.facts["metadata"] = metadata
    limit = f", at most {metadata.max_episodes} episodes at once" if metadata.max_episodes else ""
    return True, f"{metadata.kind}, spec hash {metadata.hash[:12]}{limit}"


async def _schema(target: Target) -> Outcome:
    schema = await get_json(target, "/schema")
    committed = json.loads(resources.files("molt_envs.remote").joinpath("protocol.schema.json").read_text())
    if not isinstance(schema, dict) or schema.get("protocol") != committed["protocol"]:
        got = schema.get("protocol") if isinstance(schema, dict) else schema
        return False, f"/schema is of protocol {got!r}, protocol.schema.json of {committed['protocol']!r}"
    missing = sorted(set(committed) - set(schema))
    if missing:
        return False, f"/schema lacks {missing}"
    differ = sorted(k for k in committed if schema[k] != committed[k])
    if differ:
        return True, f"{committed['protocol']}; documents differing from protocol.schema.json: {', '.join(differ)}"
    return True, f"{committed['protocol']}, identical to protocol.schema.json"


async def _dataset(target: Target) -> Outcome:
    import httpx

    metadata = target.facts.get("metadata")
    if metadata is None:
        return False, "no valid metadata to read the env's splits from (see the metadata check)"
    splits = list(metadata.spec.get("datasets") or {})
    if not splits:
        return True, "the env declares no dataset split (episodes reset with a stand-in prompt)"
    split = "train" if "train" in splits else splits[0]
    async with httpx.AsyncClient(timeout=HTTP_TIMEOUT_S, trust_env=False) as client:
        response = await client.get(f"{target.http}/datasets/{split}", params={"limit": 2})
    if response.status_code != 200:
        return False, f"GET /datasets/{split} answered HTTP {response.status_code}"
    lines = [json.loads(line) for line in response.text.splitlines() if line]
    rows = [line["row"] for line in lines if "row" in line]
    if not lines or lines[-1] != {"end": len(rows)} or not rows:
        return False, f"split {split!r} did not stream rows then {{'end': n}}: {response.text[:160]!r}"
    if not isinstance(rows[0], dict) or "prompt" not in rows[0]:
        return False, f"row 0 of {split!r} has no 'prompt': {json.dumps(rows[0])[:120]}"
    target.facts["row"] = rows[0]
    return True, f"split {split!r}: {len(rows)} row(s) then the end marker"


async def _episode_check(target: Target) -> Outcome:
    turns = await _episode(target)
    return True, f"reset, {turns} step(s), close"


async def _version_mismatch(target: Target) -> Outcome:
    from websockets.exceptions import ConnectionClosed, InvalidStatus

    from molt_envs.remote.protocol import PROTOCOL_MISMATCH

    try:
        ws = await connect(target.ws_url(query="999"))
    except InvalidStatus as exc:
        status = exc.response.status_code
        return status < 500, f"the handshake was refused with HTTP {status}"
    try:
        async with asyncio.timeout(REFUSAL_WAIT_S):
            answered = json.loads(await ws.recv())
    except ConnectionClosed as exc:
        return exc.rcvd is not None, f"closed with {close_code(exc)}, no error message"
    except TimeoutError:  # no refusal came: does it play an episode of a version it does not speak?
        answered = await answer(ws, WIRE.reset_frame(target), "a reset at protocol version 999")
        if error_code(answered) != PROTOCOL_MISMATCH:
            return False, f"no refusal of protocol=999; a reset was answered {json.dumps(answered)[:120]}"
    finally:
        await ws.close()
    code = error_code(answered)
    return code == PROTOCOL_MISMATCH, f"answered {code or json.dumps(answered)[:120]}"


async def _unknown_env(target: Target) -> Outcome:
    from websockets.exceptions import InvalidStatus

    from molt_envs.remote.protocol import PROTOCOL_VERSION

    url = f"ws{target.base[len('http') :]}/molt-check/no-such-env-v1/ws?protocol={PROTOCOL_VERSION}"
    try:
        ws = await connect(url)
    except InvalidStatus as exc:
        status = exc.response.status_code
        return status < 500, f"the handshake was refused with HTTP {status}"
    try:
        answered = await answer(ws, WIRE.reset_frame(target), "a reset of an unknown env")
    except Fail as exc:
        return "close code" in str(exc), str(exc)
    finally:
        await ws.close()
    return error_code(answered) is not None, f"answered {json.dumps(answered)[:120]}"


CHECKS: list[tuple[str, Check]] = [
    ("health", _health),
    ("metadata", _metadata),
    ("schema matches protocol.schema.json", _schema),
    ("dataset split streams", _dataset),
    ("episode (reset, step, close)", _episode_check),
    ("wrong protocol version refused", _version_mismatch),
    ("unknown env ID refused", _unknown_env),
    ("step before reset", step_before_reset),
    ("malformed JSON answered INVALID_JSON", malformed_json),
    (
        "unknown message type answered an error",
        refused_with(
            [json.dumps({"type": "molt-check-explode", "data": {}})],
            ("UNKNOWN_TYPE", "VALIDATION_ERROR"),
            "an unknown message type",
        ),
    ),
    (
        "invalid fields answered VALIDATION_ERROR",
        refused_with(
            [json.dumps({"type": "step", "data": {"turn": -1, "molt_check_unknown_field": 1}})],
            ("VALIDATION_ERROR",),
            "a step with invalid fields",
        ),
    ),
    (
        "binary garbage answered an error",
        refused_with(
            [b"\x00\xffmolt-check\x80"],
            ("INVALID_JSON", "VALIDATION_ERROR", "UNKNOWN_TYPE"),
            "a binary frame of garbage",
        ),
    ),
    ("concurrent episodes", concurrent),
    ("idle session still answers", idle_session),
    ("client dropped mid-episode", dropped_client),
    ("oversized message refused", oversized),
]
