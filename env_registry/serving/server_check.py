"""``molt-env check URL [--protocol molt-env/1|openenv]``: a protocol conformance suite for any env server, ours or not.

Each check is a small coroutine taking a ``Target`` and returning ``(passed, detail)``; ``server_report`` runs them in
order, each under ``timeout_s`` (a server that never answers fails that check instead of hanging the suite), and
returns a ``molt_envs.conformance.CheckReport`` (its ``render()`` is the PASS/FAIL table). What each protocol's own
client does is done with that client (``RemoteEnv`` for ``molt-env/1``, OpenEnv's ``GenericEnvClient``); only the
garbage-in cases speak raw WebSocket frames (the ``websockets`` package).

Checks, ``molt-env/1`` (``molt_envs.remote.protocol``): ``/health``, ``/<id>/metadata`` and ``/<id>/schema`` valid and
of this protocol version (the schema compared with ``protocol.schema.json``), a dataset split streamed to its end, a
reset -> step ... -> close episode with a scripted action, a wrong protocol version and an unknown env ID refused,
a step before reset / malformed JSON / an unknown message type / a binary frame answered with a protocol error (the
episode staying usable), N concurrent episodes, a session idle for a while still answering, a client dropping its
connection mid-episode (the server serving new episodes after), an oversized message refused cleanly.

Checks, ``openenv`` (OpenEnv's ``/ws`` wire): ``/health``, ``/metadata``, ``/schema``, a ``/ws`` episode through
OpenEnv's client, a malformed action answered ``VALIDATION_ERROR``, malformed JSON / an unknown message type / a step
before reset answered with an error, concurrent sessions, ``CAPACITY_REACHED`` past ``max_sessions`` (when given:
OpenEnv servers do not publish it), an idle session, a dropped client, an oversized message.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from importlib import resources
from typing import Any
from urllib.parse import quote, urlsplit

from molt_envs.conformance import CheckReport

PROTOCOLS = ("molt-env/1", "openenv")
SESSIONS = 16  # concurrent episodes of the concurrency check
MAX_TURNS = 8  # steps of a scripted episode before it is closed anyway
IDLE_S = 2.0  # how long the idle-session check waits between reset and step
OVERSIZED_BYTES = 32 << 20  # beyond the 16 MiB uvicorn/websockets take by default
HTTP_TIMEOUT_S = 10.0
REFUSAL_WAIT_S = 3.0  # how long a server may take to refuse a protocol version it does not speak

Outcome = tuple[bool, str]


@dataclass
class Target:
    """The server under test: ``base`` (``http://host:port``), and the env's ``path`` under it (``ns/name-v1`` for
    ``molt-env/1``; for OpenEnv the path the app is mounted at, often empty)."""

    url: str
    protocol: str
    base: str
    path: str
    sessions: int = SESSIONS
    max_sessions: int | None = None
    timeout_s: float = 30.0
    facts: dict[str, Any] = field(default_factory=dict)  # what earlier checks learned (metadata, schema, a row)

    @property
    def http(self) -> str:
        return f"{self.base}/{self.path}" if self.path else self.base

    def ws_url(self, query: str = "") -> str:
        root = "ws" + self.http[len("http") :]
        if self.protocol == "molt-env/1":
            from molt_envs.remote.protocol import PROTOCOL_VERSION

            return f"ws{self.base[len('http') :]}/{quote(self.path)}/ws?protocol={query or PROTOCOL_VERSION}"
        return f"{root}/ws" + (f"?{query}" if query else "")


def parse_target(url: str, protocol: str, **options: Any) -> Target:
    """A ``Target`` from ``http[s]://host:port[/path]``.

    Raises:
        ValueError: not an http(s) URL, an unknown protocol, or a ``molt-env/1`` URL without an env ID path.
    """
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown protocol {protocol!r}; one of {', '.join(PROTOCOLS)}")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{url!r} is not an env server URL; write http://host:port/ns/name-v1")
    path = parts.path.strip("/")
    if protocol == "molt-env/1":
        path = path.split("@")[0]  # a package pin is the env-level check's business
    if protocol == "molt-env/1" and not path:
        raise ValueError(f"{url!r} names no env; a molt-env/1 server is checked at http://host:port/ns/name-v1")
    return Target(url, protocol, f"{parts.scheme}://{parts.netloc}", path, **options)


def server_report(url: str, protocol: str = "molt-env/1", **options: Any) -> CheckReport:
    """Run every check of ``protocol`` against the server at ``url``; never raises for a broken server.

    Args:
        url: ``http://host:port/ns/name-v1`` (``molt-env/1``), or an OpenEnv app's URL (``http://host:port``).
        protocol: ``"molt-env/1"`` or ``"openenv"``.
        **options: ``sessions`` (concurrent episodes, default 16), ``max_sessions`` (OpenEnv: the server's limit,
            checked to be answered ``CAPACITY_REACHED`` past it), ``timeout_s`` (each check, default 30).

    Raises:
        ValueError: the URL or the protocol is not one this suite checks.
    """
    target = parse_target(url, protocol, **options)
    report = CheckReport(f"{protocol} server at {url}")
    checks = MOLT_CHECKS if protocol == "molt-env/1" else OPENENV_CHECKS
    for name, check in checks:
        if check is _openenv_capacity and not target.max_sessions:
            continue  # OpenEnv servers do not publish their limit: checked only with --max-sessions N (the CLI says so)
        passed, detail = asyncio.run(_run_one(check, target))
        report.add(name, passed, detail)
    return report


async def _run_one(check: Callable[[Target], Awaitable[Outcome]], target: Target) -> Outcome:
    try:
        async with asyncio.timeout(target.timeout_s):
            return await check(target)
    except TimeoutError:
        return False, f"no outcome within {target.timeout_s:g} s (the server did not answer)"
    except Exception as exc:
        return False, _why(exc)


# -- shared pieces: HTTP documents, raw frames ---------------------------------------------------------------------


async def _get_json(target: Target, path: str) -> Any:
    """``GET`` a document of the env (``/health`` of a ``molt-env/1`` server is the server's, at its root)."""
    import httpx

    root = target.base if path == "/health" and target.protocol == "molt-env/1" else target.http
    async with httpx.AsyncClient(timeout=HTTP_TIMEOUT_S, trust_env=False) as client:
        response = await client.get(root + path)
    if response.status_code != 200:
        raise _Fail(f"GET {path} answered HTTP {response.status_code}: {response.text[:120]!r}")
    try:
        return response.json()
    except ValueError:
        raise _Fail(f"GET {path} answered {response.text[:120]!r}, which is not JSON") from None


class _Fail(Exception):
    """A check's failure, its message the detail."""


def _why(exc: BaseException) -> str:
    if isinstance(exc, _Fail):
        return str(exc)
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


async def _connect(url: str) -> Any:
    from websockets.asyncio.client import connect

    return await connect(url, compression=None, max_size=None, ping_interval=None, open_timeout=HTTP_TIMEOUT_S)


async def _answer(ws: Any, frame: str | bytes, what: str) -> dict[str, Any]:
    """Send one frame, return the JSON object answered; a dropped connection or a non-JSON answer is a ``_Fail``."""
    from websockets.exceptions import ConnectionClosed

    try:
        await ws.send(frame)
        raw = await ws.recv()
    except ConnectionClosed as exc:
        raise _Fail(f"the server closed the connection on {what} ({_close_code(exc)}) instead of answering") from None
    try:
        answer = json.loads(raw)
    except ValueError:
        raise _Fail(f"the answer to {what} is not JSON: {str(raw)[:120]!r}") from None
    if not isinstance(answer, dict) or "type" not in answer:
        raise _Fail(f"the answer to {what} is not a protocol message: {str(raw)[:120]!r}")
    return answer


def _close_code(exc: Any) -> str:
    rcvd = getattr(exc, "rcvd", None)
    return f"close code {rcvd.code}" if rcvd is not None else "no close frame"


def _error_code(answer: dict[str, Any]) -> str | None:
    if answer.get("type") != "error" or not isinstance(answer.get("data"), dict):
        return None
    return answer["data"].get("code")


async def _refused_with(target: Target, frames: list[str | bytes], codes: tuple[str, ...], what: str) -> Outcome:
    """Open a session, send ``frames[:-1]`` (set-up, answered anything), then ``frames[-1]``: it must be answered an
    error with one of ``codes``, and the session must still take a reset afterwards."""
    ws = await _connect(target.ws_url())
    try:
        for frame in frames[:-1]:
            await _answer(ws, frame, "the set-up message")
        answer = await _answer(ws, frames[-1], what)
        code = _error_code(answer)
        if code not in codes:
            return False, f"{what} was answered {json.dumps(answer)[:160]}, not an error with code {'/'.join(codes)}"
        after = await _answer(ws, _reset_frame(target), "a reset after it")
        if after.get("type") != "observation":
            return False, f"answered {code}, but the session then refused a reset: {json.dumps(after)[:160]}"
        return True, f"answered {code}; the session stayed usable"
    finally:
        await ws.close()


async def _oversized(target: Target) -> Outcome:
    from websockets.exceptions import ConnectionClosed

    padding = "0" * OVERSIZED_BYTES
    if target.protocol == "molt-env/1":
        frame = json.dumps({"type": "step", "data": {**_step_data(target, 0), "action_text": padding}})
    else:
        frame = json.dumps({"type": "step", "data": {"message": padding}})
    ws = await _connect(target.ws_url())
    how = ""
    try:
        if target.protocol == "openenv":
            await _answer(ws, _reset_frame(target), "reset")
        try:
            await ws.send(frame)
            answer = json.loads(await ws.recv())
            code = _error_code(answer)
            if code is None:
                return False, f"a {OVERSIZED_BYTES >> 20} MiB message was accepted; set a message size limit"
            how = f"answered {code}"
        except ConnectionClosed as exc:
            if exc.rcvd is None:
                return False, "the server dropped the connection without a close frame"
            how = f"closed with code {exc.rcvd.code}"
    finally:
        await ws.close()
    served, detail = await _serves_episodes(target)
    return served, f"{how}; " + detail


async def _serves_episodes(target: Target) -> Outcome:
    """The server still answers ``/health`` and plays a whole new episode."""
    await _get_json(target, "/health")
    turns = await EPISODE[target.protocol](target)
    return True, f"then served a new episode ({turns} step(s))"


async def _dropped_client(target: Target) -> Outcome:
    ws = await _connect(target.ws_url())
    await _answer(ws, _reset_frame(target), "reset")
    ws.transport.abort()  # no close frame, no close message: the client vanished mid-episode
    await asyncio.sleep(0.2)
    return await _serves_episodes(target)


async def _idle_session(target: Target) -> Outcome:
    ws = await _connect(target.ws_url())
    try:
        await _answer(ws, _reset_frame(target), "reset")
        await asyncio.sleep(IDLE_S)
        answer = await _answer(ws, _step_frame(target), f"a step after {IDLE_S:g} s idle")
    finally:
        await ws.close()
    if answer.get("type") != "observation":
        return False, f"the step after {IDLE_S:g} s idle was answered {json.dumps(answer)[:160]}"
    return True, f"answered a step after {IDLE_S:g} s idle"


async def _step_before_reset(target: Target) -> Outcome:
    ws = await _connect(target.ws_url())
    try:
        answer = await _answer(ws, _step_frame(target), "a step before any reset")
        if answer.get("type") not in ("observation", "error") or (
            answer["type"] == "error" and not _error_code(answer)
        ):
            return False, f"answered {json.dumps(answer)[:160]}, neither an observation nor a protocol error"
        after = await _answer(ws, _reset_frame(target), "a reset after it")
        if after.get("type") != "observation":
            return False, f"the session then refused a reset: {json.dumps(after)[:160]}"
    finally:
        await ws.close()
    said = _error_code(answer) or "an observation (this env steps without a reset)"
    return True, f"answered {said}; the session stayed usable"


async def _concurrent(target: Target, count: int) -> Outcome:
    started = time.monotonic()
    outcomes = await asyncio.gather(
        *(EPISODE[target.protocol](target, seed=i) for i in range(count)), return_exceptions=True
    )
    failed = [o for o in outcomes if isinstance(o, BaseException)]
    if failed:
        return False, f"{len(failed)} of {count} concurrent episodes failed, e.g. {_why(failed[0])}"
    return True, f"{count} concurrent episodes completed in {time.monotonic() - started:.2f} s"


def _reset_frame(target: Target) -> str:
    if target.protocol == "molt-env/1":
        return json.dumps({"type": "reset", "data": _reset_state(target)})
    return json.dumps({"type": "reset", "data": {"seed": 0}})


def _step_frame(target: Target) -> str:
    if target.protocol == "molt-env/1":
        return json.dumps({"type": "step", "data": _step_data(target, 0)})
    return json.dumps({"type": "step", "data": _openenv_action(target)})


# -- molt-env/1 ------------------------------------------------------------------------------------------------------


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


async def _molt_health(target: Target) -> Outcome:
    from molt_envs.remote.protocol import PROTOCOL, Health

    health = Health.model_validate(await _get_json(target, "/health"))
    if health.protocol != PROTOCOL:
        return False, f"/health says protocol {health.protocol!r}, this suite checks {PROTOCOL!r}"
    if target.path not in health.envs:
        return False, f"/health lists {health.envs}, not {target.path!r}"
    return True, f"{health.status}, {PROTOCOL}, serves {', '.join(health.envs)}"


async def _molt_metadata(target: Target) -> Outcome:
    from molt_envs.remote.protocol import PROTOCOL, Metadata

    metadata = Metadata.model_validate(await _get_json(target, "/metadata"))
    if metadata.id != target.path or metadata.protocol != PROTOCOL:
        return False, f"answered the metadata of {metadata.id!r} ({metadata.protocol}) for {target.path!r}"
    target.facts["metadata"] = metadata
    limit = f", at most {metadata.max_episodes} episodes at once" if metadata.max_episodes else ""
    return True, f"{metadata.kind}, spec hash {metadata.hash[:12]}{limit}"


async def _molt_schema(target: Target) -> Outcome:
    schema = await _get_json(target, "/schema")
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


async def _molt_dataset(target: Target) -> Outcome:
    import httpx

    metadata = target.facts.get("metadata")
    if metadata is None:
        return False, "no valid metadata to read the env's splits from (see the metadata check)"
    splits = list(metadata.spec.get("datasets") or {})
    if not splits:
        return True, "the env declares no dataset split (episodes reset with a stand-in prompt)"
    split = "train" if "train" in splits else splits[0]
    lines: list[dict[str, Any]] = []
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


async def _molt_episode(target: Target, seed: int = 0) -> int:
    """reset -> step ... -> close through ``RemoteEnv``; returns the steps taken (raises on any failure)."""
    from molt_envs.contract import SamplingParams
    from molt_envs.remote.client import Endpoint, RemoteEnv

    metadata = target.facts.get("metadata")
    if metadata is not None and metadata.kind == "chat_agent":
        raise _Fail("a chat agent's episode is a 'run' that calls a policy server; this suite cannot script one")
    env = RemoteEnv(Endpoint(target.base, target.path, timeout_s=target.timeout_s))
    state = await env.reset(_reset_state(target))
    if "observation" not in state:
        raise _Fail(f"reset answered a state without an observation: {state!r:.120}")
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


async def _molt_episode_check(target: Target) -> Outcome:
    turns = await _molt_episode(target)
    return True, f"reset, {turns} step(s), close"


async def _molt_version_mismatch(target: Target) -> Outcome:
    from websockets.exceptions import ConnectionClosed, InvalidStatus

    from molt_envs.remote.protocol import PROTOCOL_MISMATCH

    try:
        ws = await _connect(target.ws_url(query="999"))
    except InvalidStatus as exc:
        status = exc.response.status_code
        return status < 500, f"the handshake was refused with HTTP {status}"
    try:
        async with asyncio.timeout(REFUSAL_WAIT_S):
            answer = json.loads(await ws.recv())
    except ConnectionClosed as exc:
        return exc.rcvd is not None, f"closed with {_close_code(exc)}, no error message"
    except TimeoutError:  # no refusal came: does it play an episode of a version it does not speak?
        answer = await _answer(ws, _reset_frame(target), "a reset at protocol version 999")
        if _error_code(answer) != PROTOCOL_MISMATCH:
            return False, f"no refusal of protocol=999; a reset was answered {json.dumps(answer)[:120]}"
    finally:
        await ws.close()
    code = _error_code(answer)
    return code == PROTOCOL_MISMATCH, f"answered {code or json.dumps(answer)[:120]}"


async def _molt_unknown_env(target: Target) -> Outcome:
    from websockets.exceptions import InvalidStatus

    from molt_envs.remote.protocol import PROTOCOL_VERSION

    url = f"ws{target.base[len('http') :]}/molt-check/no-such-env-v1/ws?protocol={PROTOCOL_VERSION}"
    try:
        ws = await _connect(url)
    except InvalidStatus as exc:
        status = exc.response.status_code
        return status < 500, f"the handshake was refused with HTTP {status}"
    try:
        answer = await _answer(ws, _reset_frame(target), "a reset of an unknown env")
    except _Fail as exc:
        return "close code" in str(exc), str(exc)
    finally:
        await ws.close()
    return _error_code(answer) is not None, f"answered {json.dumps(answer)[:120]}"


async def _molt_malformed_json(target: Target) -> Outcome:
    return await _refused_with(target, ['{"type": "reset", "data": '], ("INVALID_JSON",), "malformed JSON")


async def _molt_unknown_type(target: Target) -> Outcome:
    frame = json.dumps({"type": "molt-check-explode", "data": {}})
    return await _refused_with(target, [frame], ("UNKNOWN_TYPE", "VALIDATION_ERROR"), "an unknown message type")


async def _molt_invalid_fields(target: Target) -> Outcome:
    frame = json.dumps({"type": "step", "data": {"turn": -1, "molt_check_unknown_field": 1}})
    return await _refused_with(target, [frame], ("VALIDATION_ERROR",), "a step with invalid fields")


async def _binary_frame(target: Target) -> Outcome:
    codes = ("INVALID_JSON", "VALIDATION_ERROR", "UNKNOWN_TYPE")
    return await _refused_with(target, [b"\x00\xffmolt-check\x80"], codes, "a binary frame of garbage")


async def _molt_concurrency(target: Target) -> Outcome:
    return await _concurrent(target, target.sessions)


MOLT_CHECKS: list[tuple[str, Callable[[Target], Awaitable[Outcome]]]] = [
    ("health", _molt_health),
    ("metadata", _molt_metadata),
    ("schema matches protocol.schema.json", _molt_schema),
    ("dataset split streams", _molt_dataset),
    ("episode (reset, step, close)", _molt_episode_check),
    ("wrong protocol version refused", _molt_version_mismatch),
    ("unknown env ID refused", _molt_unknown_env),
    ("step before reset", _step_before_reset),
    ("malformed JSON answered INVALID_JSON", _molt_malformed_json),
    ("unknown message type answered an error", _molt_unknown_type),
    ("invalid fields answered VALIDATION_ERROR", _molt_invalid_fields),
    ("binary garbage answered an error", _binary_frame),
    ("concurrent episodes", _molt_concurrency),
    ("idle session still answers", _idle_session),
    ("client dropped mid-episode", _dropped_client),
    ("oversized message refused", _oversized),
]


# -- OpenEnv ---------------------------------------------------------------------------------------------------------


def _openenv_action(target: Target) -> dict[str, Any]:
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


async def _openenv_health(target: Target) -> Outcome:
    health = await _get_json(target, "/health")
    status = health.get("status") if isinstance(health, dict) else None
    return status == "healthy", f"status {status!r}"


async def _openenv_metadata(target: Target) -> Outcome:
    from openenv.core.env_server.types import EnvironmentMetadata

    metadata = EnvironmentMetadata.model_validate(await _get_json(target, "/metadata"))
    return True, f"{metadata.name} {metadata.version or ''}".strip()


async def _openenv_schema(target: Target) -> Outcome:
    schema = await _get_json(target, "/schema")
    missing = [k for k in ("action", "observation", "state") if not isinstance(schema.get(k), dict)]
    if missing:
        return False, f"/schema lacks the JSON schema of {missing}"
    target.facts["schema"] = schema
    fields = sorted(schema["action"].get("properties") or {})
    return True, f"action fields {fields}"


async def _openenv_episode(target: Target, seed: int = 0) -> int:
    from openenv.core.generic_client import GenericEnvClient

    turns = 0
    async with GenericEnvClient(base_url=target.http, message_timeout_s=target.timeout_s) as client:
        await _openenv_reset(client, seed)
        for _ in range(MAX_TURNS):
            result = await client.step(_openenv_action(target))
            turns += 1
            if result.done:
                break
    return turns


async def _openenv_reset(client: Any, seed: int, wait_s: float = 5.0) -> Any:
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


async def _openenv_episode_check(target: Target) -> Outcome:
    turns = await _openenv_episode(target)
    return True, f"reset, {turns} step(s), close (OpenEnv's GenericEnvClient)"


async def _openenv_malformed_action(target: Target) -> Outcome:
    frame = json.dumps({"type": "step", "data": {"molt_check_unknown_field": 1}})
    return await _refused_with(target, [_reset_frame(target), frame], ("VALIDATION_ERROR",), "a malformed action")


async def _openenv_malformed_json(target: Target) -> Outcome:
    return await _refused_with(target, ['{"type": "reset", "data": '], ("INVALID_JSON",), "malformed JSON")


async def _openenv_unknown_type(target: Target) -> Outcome:
    frame = json.dumps({"type": "molt-check-explode", "data": {}})
    return await _refused_with(target, [frame], ("UNKNOWN_TYPE",), "an unknown message type")


async def _openenv_concurrency(target: Target) -> Outcome:
    count = min(target.sessions, target.max_sessions) if target.max_sessions else target.sessions
    return await _concurrent(target, count)


async def _openenv_capacity(target: Target) -> Outcome:
    from openenv.core.generic_client import GenericEnvClient

    clients = [
        GenericEnvClient(base_url=target.http, message_timeout_s=target.timeout_s)
        for _ in range(target.max_sessions + 1)
    ]
    try:
        for i, client in enumerate(clients[:-1]):
            await _openenv_reset(client, i)
        try:
            await clients[-1].connect()
            await clients[-1].reset(seed=0)
        except Exception as exc:
            if "CAPACITY_REACHED" in str(exc):
                return True, f"{target.max_sessions} sessions open, the next answered CAPACITY_REACHED"
            return False, f"session {target.max_sessions + 1} failed otherwise: {_why(exc)}"
        return False, f"session {target.max_sessions + 1} was accepted past max_sessions={target.max_sessions}"
    finally:
        for client in clients:
            with contextlib.suppress(Exception):
                await client.close()


async def _openenv_dropped_client(target: Target) -> Outcome:
    return await _dropped_client(target)


OPENENV_CHECKS: list[tuple[str, Callable[[Target], Awaitable[Outcome]]]] = [
    ("health", _openenv_health),
    ("metadata", _openenv_metadata),
    ("schema", _openenv_schema),
    ("episode over /ws (reset, step, close)", _openenv_episode_check),
    ("malformed action answered VALIDATION_ERROR", _openenv_malformed_action),
    ("malformed JSON answered INVALID_JSON", _openenv_malformed_json),
    ("unknown message type answered UNKNOWN_TYPE", _openenv_unknown_type),
    ("step before reset", _step_before_reset),
    ("concurrent sessions", _openenv_concurrency),
    ("CAPACITY_REACHED past max sessions", _openenv_capacity),
    ("idle session still answers", _idle_session),
    ("client dropped mid-episode", _openenv_dropped_client),
    ("oversized message refused", _oversized),
]

EPISODE: dict[str, Callable[..., Awaitable[int]]] = {"molt-env/1": _molt_episode, "openenv": _openenv_episode}
