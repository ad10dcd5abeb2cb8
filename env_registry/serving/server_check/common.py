"""What every protocol's checks share: the ``Target`` under test and its protocol's ``Wire``, HTTP documents, raw
frames, and the checks that read the same on both wires (garbage refused, a step before reset, an idle session, a
dropped client, an oversized message, concurrent episodes). Each check is a coroutine taking a ``Target`` and
returning ``(passed, detail)``; raising ``Fail`` (or anything) fails it with the message as the detail."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

SESSIONS = 16  # concurrent episodes of the concurrency check
MAX_TURNS = 8  # steps of a scripted episode before it is closed anyway
IDLE_S = 2.0  # how long the idle-session check waits between reset and step
OVERSIZED_BYTES = 32 << 20  # beyond the 16 MiB uvicorn/websockets take by default
HTTP_TIMEOUT_S = 10.0

Outcome = tuple[bool, str]
Check = Callable[["Target"], Awaitable[Outcome]]


@dataclass(frozen=True)
class Wire:
    """One protocol's frames and client, as the shared checks need them."""

    ws_url: Callable[[Target, str], str]  # the session URL (a query string: the protocol version to ask for)
    reset_frame: Callable[[Target], str]
    step_frame: Callable[[Target], str]
    oversized_step: Callable[[Target, str], str]  # a step frame carrying the given padding
    episode: Callable[..., Awaitable[int]]  # (target, seed=0) -> steps of one whole scripted episode
    resets_before_step: bool  # whether a step of a fresh session must follow a reset


@dataclass
class Target:
    """The server under test: ``base`` (``http://host:port``), and the env's ``path`` under it (``ns/name-v1`` for
    ``molt-env/1``; for OpenEnv the path the app is mounted at, often empty)."""

    url: str
    protocol: str
    wire: Wire
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
        return self.wire.ws_url(self, query)


class Fail(Exception):
    """A check's failure, its message the detail."""


def why(exc: BaseException) -> str:
    if isinstance(exc, Fail):
        return str(exc)
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


async def get_json(target: Target, path: str, root: str | None = None) -> Any:
    """``GET`` a document under the env's URL (or under ``root``)."""
    import httpx

    async with httpx.AsyncClient(timeout=HTTP_TIMEOUT_S, trust_env=False) as client:
        response = await client.get((root or target.http) + path)
    if response.status_code != 200:
        raise Fail(f"GET {path} answered HTTP {response.status_code}: {response.text[:120]!r}")
    try:
        return response.json()
    except ValueError:
        raise Fail(f"GET {path} answered {response.text[:120]!r}, which is not JSON") from None


async def connect(url: str) -> Any:
    from websockets.asyncio.client import connect

    return await connect(url, compression=None, max_size=None, ping_interval=None, open_timeout=HTTP_TIMEOUT_S)


async def answer(ws: Any, frame: str | bytes, what: str) -> dict[str, Any]:
    """Send one frame, return the JSON object answered; a dropped connection or a non-JSON answer is a ``Fail``."""
    from websockets.exceptions import ConnectionClosed

    try:
        await ws.send(frame)
        raw = await ws.recv()
    except ConnectionClosed as exc:
        raise Fail(f"the server closed the connection on {what} ({close_code(exc)}) instead of answering") from None
    try:
        answered = json.loads(raw)
    except ValueError:
        raise Fail(f"the answer to {what} is not JSON: {str(raw)[:120]!r}") from None
    if not isinstance(answered, dict) or "type" not in answered:
        raise Fail(f"the answer to {what} is not a protocol message: {str(raw)[:120]!r}")
    return answered


def close_code(exc: Any) -> str:
    rcvd = getattr(exc, "rcvd", None)
    return f"close code {rcvd.code}" if rcvd is not None else "no close frame"


def error_code(answered: dict[str, Any]) -> str | None:
    if answered.get("type") != "error" or not isinstance(answered.get("data"), dict):
        return None
    return answered["data"].get("code")


def refused_with(frames: list[str | bytes], codes: tuple[str, ...], what: str, after_reset: bool = False) -> Check:
    """A check: open a session (and reset it, with ``after_reset``), send ``frames``; the last must be answered an
    error with one of ``codes`` (the others anything), and the session must still take a reset afterwards."""

    async def check(target: Target) -> Outcome:
        ws = await connect(target.ws_url())
        try:
            for frame in ([target.wire.reset_frame(target)] if after_reset else []) + frames[:-1]:
                await answer(ws, frame, "the set-up message")
            answered = await answer(ws, frames[-1], what)
            code = error_code(answered)
            if code not in codes:
                return (
                    False,
                    f"{what} was answered {json.dumps(answered)[:160]}, not an error with code {'/'.join(codes)}",
                )
            after = await answer(ws, target.wire.reset_frame(target), "a reset after it")
            if after.get("type") != "observation":
                return False, f"answered {code}, but the session then refused a reset: {json.dumps(after)[:160]}"
            return True, f"answered {code}; the session stayed usable"
        finally:
            await ws.close()

    return check


malformed_json = refused_with(['{"type": "reset", "data": '], ("INVALID_JSON",), "malformed JSON")


async def oversized(target: Target) -> Outcome:
    from websockets.exceptions import ConnectionClosed

    frame = target.wire.oversized_step(target, "0" * OVERSIZED_BYTES)
    ws = await connect(target.ws_url())
    how = ""
    try:
        if target.wire.resets_before_step:
            await answer(ws, target.wire.reset_frame(target), "reset")
        try:
            await ws.send(frame)
            code = error_code(json.loads(await ws.recv()))
            if code is None:
                return False, f"a {OVERSIZED_BYTES >> 20} MiB message was accepted; set a message size limit"
            how = f"answered {code}"
        except ConnectionClosed as exc:
            if exc.rcvd is None:
                return False, "the server dropped the connection without a close frame"
            how = f"closed with code {exc.rcvd.code}"
    finally:
        await ws.close()
    served, detail = await serves_episodes(target)
    return served, f"{how}; " + detail


async def serves_episodes(target: Target) -> Outcome:
    """The server still answers ``/health`` and plays a whole new episode."""
    await get_json(target, "/health", target.base if target.protocol == "molt-env/1" else None)
    turns = await target.wire.episode(target)
    return True, f"then served a new episode ({turns} step(s))"


async def dropped_client(target: Target) -> Outcome:
    ws = await connect(target.ws_url())
    await answer(ws, target.wire.reset_frame(target), "reset")
    ws.transport.abort()  # no close frame, no close message: the client vanished mid-episode
    await asyncio.sleep(0.2)
    return await serves_episodes(target)


async def idle_session(target: Target) -> Outcome:
    ws = await connect(target.ws_url())
    try:
        await answer(ws, target.wire.reset_frame(target), "reset")
        await asyncio.sleep(IDLE_S)
        answered = await answer(ws, target.wire.step_frame(target), f"a step after {IDLE_S:g} s idle")
    finally:
        await ws.close()
    if answered.get("type") != "observation":
        return False, f"the step after {IDLE_S:g} s idle was answered {json.dumps(answered)[:160]}"
    return True, f"answered a step after {IDLE_S:g} s idle"


async def step_before_reset(target: Target) -> Outcome:
    ws = await connect(target.ws_url())
    try:
        answered = await answer(ws, target.wire.step_frame(target), "a step before any reset")
        if answered.get("type") not in ("observation", "error") or (
            answered["type"] == "error" and not error_code(answered)
        ):
            return False, f"answered {json.dumps(answered)[:160]}, neither an observation nor a protocol error"
        after = await answer(ws, target.wire.reset_frame(target), "a reset after it")
        if after.get("type") != "observation":
            return False, f"the session then refused a reset: {json.dumps(after)[:160]}"
    finally:
        await ws.close()
    said = error_code(answered) or "an observation (this env steps without a reset)"
    return True, f"answered {said}; the session stayed usable"


async def concurrent(target: Target) -> Outcome:
    """``sessions`` episodes at once (no more than the server's ``max_sessions``, where given)."""
    count = min(target.sessions, target.max_sessions) if target.max_sessions else target.sessions
    started = time.monotonic()
    outcomes = await asyncio.gather(
        *(target.wire.episode(target, seed=i) for i in range(count)), return_exceptions=True
    )
    failed = [o for o in outcomes if isinstance(o, BaseException)]
    if failed:
        return False, f"{len(failed)} of {count} concurrent episodes failed, e.g. {why(failed[0])}"
    return True, f"{count} concurrent episodes completed in {time.monotonic() - started:.2f} s"
