"""The env server: envs and chat agents served over the env protocol (``molt_envs.remote.protocol``), FastAPI + uvicorn.

Each WebSocket is one episode with a fresh instance, made at its first message (a game's: one session, driven call
by call); the instance's own failures go back as ``EXECUTION_ERROR`` answers (the client records them as the
episode's failure), and its ``close`` runs however the episode ends (a ``close`` message, or the client vanishing:
then the call in flight, if any, is cancelled first). A malformed message (a binary frame too) gets an error answer
and leaves the episode open. The server knows nothing of the registry: ``ServedEnv`` hands it a factory, the spec
JSON and its hash, and the dataset rows.

The envs' code (the factory, ``reset``/``step``/``run``/``close``, game calls) runs on an event loop of its own, in
one thread (``EnvLoop``), never on uvicorn's: the server keeps answering WebSocket pings and ``/health`` while an
env step runs, even one that blocks its loop for a while, so a client's keepalive (``molt_envs.remote.client``)
tells a slow env from a dead server. ``/health`` answers once the env loop has run (``env_loop_lag_s`` says how
long that took): a server whose env loop is wedged stops answering it, and is restarted as hung.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import json
import logging
import random
import socket
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, HTTPException, WebSocket, WebSocketDisconnect
from fastapi.responses import StreamingResponse
from pydantic import ValidationError

from molt_envs.contract import ChatAgent, ChatContext, Env, Result, SamplingParams
from molt_envs.remote.protocol import (
    CLIENT_MESSAGE,
    EXECUTION_ERROR,
    FACTORY_ERROR,
    GAME_CALLS,
    INVALID_JSON,
    PROTOCOL,
    PROTOCOL_MISMATCH,
    PROTOCOL_VERSION,
    UNKNOWN_TYPE,
    VALIDATION_ERROR,
    ChatRun,
    ResetState,
    dumps,
    error_message,
    no_images,
    protocol_json_schema,
    result_message,
    step_state,
)

log = logging.getLogger("molt_envs.remote.server")


@dataclass
class ServedEnv:
    """One env as a server serves it."""

    env_id: str
    kind: str  # "env" | "chat_agent" | "game"
    factory: Callable[[], Env | ChatAgent | Any]  # a fresh instance per episode (a game: per session)
    spec: dict[str, Any]  # the EnvSpec as JSON data
    spec_hash: str
    rows: Callable[[str, int | None], Iterable[dict[str, Any]]]  # (split, limit) -> normalized rows
    splits: list[str] = field(default_factory=list)


class EnvLoop:
    """The event loop the served envs' code runs on, in a daemon thread of its own (started at first use): one loop
    for every episode of the server, as when the envs ran on the server's loop (loop-bound objects an env shares
    between its instances keep working, and game calls still run one at a time), but not the loop that answers the
    WebSockets' pings and ``/health``."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    def loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                factory = _loop_factory() or asyncio.new_event_loop
                self._loop = factory()
                threading.Thread(target=self._loop.run_forever, daemon=True, name="molt-env-envs").start()
            return self._loop

    def run(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Future:
        """``coro`` run as a task of the env loop; the returned future (of the calling loop) resolves as it does.
        (Two ``call_soon_threadsafe`` hops and no ``concurrent.futures.Future``: this runs once per message.)"""
        caller = asyncio.get_running_loop()
        answer = caller.create_future()
        self.loop().call_soon_threadsafe(_start, coro, answer, caller)
        return answer

    async def lag_s(self) -> float:
        """How long a no-op scheduled on the env loop took to run (waits as long as it takes)."""
        start = time.monotonic()
        await self.run(asyncio.sleep(0))
        return time.monotonic() - start


def _start(coro: Coroutine[Any, Any, Any], answer: asyncio.Future, caller: asyncio.AbstractEventLoop) -> None:
    asyncio.get_running_loop().create_task(coro).add_done_callback(functools.partial(_deliver, answer, caller))


def _deliver(answer: asyncio.Future, caller: asyncio.AbstractEventLoop, task: asyncio.Task) -> None:
    with contextlib.suppress(RuntimeError):  # the server's loop is closed: nobody waits for it
        caller.call_soon_threadsafe(_settle, answer, task)


def _settle(answer: asyncio.Future, task: asyncio.Task) -> None:
    if answer.done():
        return
    if task.cancelled():
        answer.cancel()
    elif (exc := task.exception()) is not None:
        answer.set_exception(exc)
    else:
        answer.set_result(task.result())


def _on_disconnect(call: asyncio.Future, incoming: asyncio.Future) -> None:
    """The client's next message arrived while ``call`` runs: if it is the disconnect, stop waiting for ``call``."""
    if call.done() or incoming.cancelled() or incoming.exception() is not None:
        return
    if incoming.result()["type"] == "websocket.disconnect":
        call.set_result(None)


class _Refused(Exception):
    """A message the episode cannot take (answered with ``code``, the episode stays open)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def create_app(envs: list[ServedEnv], max_episodes: int | None = None) -> FastAPI:
    """The FastAPI app serving ``envs``, each under ``/<env id>/``; at most ``max_episodes`` episodes run at once
    (per env; later ones wait for a free slot)."""
    if max_episodes is not None and max_episodes < 1:
        raise ValueError(f"max_episodes must be >= 1 or None, got {max_episodes}")
    app = FastAPI(title="molt env server", description=f"Serves {', '.join(e.env_id for e in envs)} over {PROTOCOL}.")
    env_loop = EnvLoop()
    app.state.env_loop = env_loop

    @app.get("/health")
    async def health() -> dict[str, Any]:
        lag = await env_loop.lag_s()  # a wedged env loop: no answer (the prober's timeout calls it hung)
        return {"status": "healthy", "protocol": PROTOCOL, "envs": [e.env_id for e in envs], "env_loop_lag_s": lag}

    for served in envs:
        _add_env_routes(app, served, max_episodes, env_loop)
    return app


def _add_env_routes(app: FastAPI, served: ServedEnv, max_episodes: int | None, env_loop: EnvLoop) -> None:
    prefix = f"/{served.env_id}"
    slots = asyncio.Semaphore(max_episodes) if max_episodes else contextlib.nullcontext()
    metadata = {
        "protocol": PROTOCOL,
        "id": served.env_id,
        "kind": served.kind,
        "hash": served.spec_hash,
        "spec": served.spec,
        "max_episodes": max_episodes,
    }

    @app.get(f"{prefix}/metadata")
    async def get_metadata() -> dict[str, Any]:
        return metadata

    @app.get(f"{prefix}/schema")
    async def get_schema() -> dict[str, Any]:
        return protocol_json_schema()

    @app.get(f"{prefix}/datasets/{{split}}")
    def get_rows(split: str, limit: int | None = None) -> StreamingResponse:
        if split not in served.splits:
            raise HTTPException(404, f"{served.env_id} has no dataset split {split!r}; splits: {served.splits}")
        return StreamingResponse(_row_lines(served, split, limit), media_type="application/x-ndjson")

    @app.websocket(f"{prefix}/ws")
    async def episode(ws: WebSocket, protocol: str | None = None) -> None:
        await ws.accept()
        if protocol != str(PROTOCOL_VERSION):
            message = f"this server speaks {PROTOCOL}; the client asked for protocol version {protocol!r}"
            await ws.send_text(dumps(error_message(PROTOCOL_MISMATCH, message)))
            await ws.close(code=1008)
            return
        async with slots:
            await _run_episode(ws, served, env_loop)


def _row_lines(served: ServedEnv, split: str, limit: int | None) -> Iterator[str]:
    """``{"row": ...}`` lines, then ``{"end": count}``, or ``{"error": ...}`` where reading the split failed (so a
    client can tell a complete split from a cut one)."""
    count = 0
    try:
        for row in served.rows(split, limit):
            yield json.dumps({"row": row}) + "\n"
            count += 1
    except Exception as exc:
        yield json.dumps({"error": f"{type(exc).__name__}: {exc}"}) + "\n"
        return
    yield json.dumps({"end": count}) + "\n"


async def _run_episode(ws: WebSocket, served: ServedEnv, env_loop: EnvLoop) -> None:
    """Answer the episode's messages in order, each computed on the env loop, while listening for the next one: a
    client that vanishes mid-call gets its call cancelled and its instance closed at once."""
    session = _Session(served)
    incoming = asyncio.ensure_future(ws.receive())
    closed = False
    try:
        while True:
            received = await incoming
            if received["type"] == "websocket.disconnect":
                return
            incoming = asyncio.ensure_future(ws.receive())
            raw = received["text"] if received.get("text") is not None else received.get("bytes") or b""
            try:
                message = CLIENT_MESSAGE.validate_json(raw)
            except ValidationError as exc:
                code = INVALID_JSON if any(e["type"] == "json_invalid" for e in exc.errors()) else VALIDATION_ERROR
                await ws.send_text(dumps(error_message(code, f"message refused: {_summary(exc)}")))
                continue
            if message.type == "close":
                closed = True
                await ws.send_text(dumps(await env_loop.run(session.close())))
                return
            call = env_loop.run(session.answer(message))
            watch = functools.partial(_on_disconnect, call)
            incoming.add_done_callback(watch)
            text = await call
            incoming.remove_done_callback(watch)
            if text is None:
                return  # abandoned mid-call: the finally below cancels it
            await ws.send_text(text)  # (a message sent before this answer waits its turn)
    except WebSocketDisconnect:
        pass
    finally:
        incoming.cancel()
        if not closed:
            await asyncio.shield(env_loop.run(session.abandon()))


class _Session:
    """An episode's instance and the call it is running, on the env loop (every method runs there)."""

    def __init__(self, served: ServedEnv) -> None:
        self.served = served
        self.instance: Any = None  # an Env, a ChatAgent, or a game
        self.task: asyncio.Task | None = None  # the call in flight

    async def answer(self, message: Any) -> str:
        """The answer to one message (not ``close``), as JSON text."""
        self.task = asyncio.current_task()
        try:
            if self.instance is None:
                try:
                    self.instance = self.served.factory()
                except Exception as exc:
                    return dumps(error_message(FACTORY_ERROR, _describe(exc), type(exc).__name__))
            try:
                return dumps(await _handle(self.instance, self.served, message))
            except _Refused as exc:
                return dumps(error_message(exc.code, str(exc)))
            except Exception as exc:  # the env's own failure: the client records it as the episode's
                return dumps(error_message(EXECUTION_ERROR, _describe(exc), type(exc).__name__))
        finally:
            self.task = None

    async def close(self) -> dict[str, Any]:
        """The ``close`` message: close the instance; the answer carries its failure."""
        closing, self.instance = self.instance, None
        return await _close(closing)

    async def abandon(self) -> None:
        """The client went away (or the episode ended): cancel the call in flight, close what the episode holds."""
        task = self.task
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        if self.instance is not None:
            answer = await self.close()
            if answer["type"] == "error":
                log.warning("closing an abandoned episode of %s: %s", self.served.env_id, answer["data"]["message"])


async def _handle(instance: Any, served: ServedEnv, message: Any) -> dict[str, Any]:
    if served.kind == "game":
        if message.type not in GAME_CALLS:
            raise _Refused(UNKNOWN_TYPE, f"{served.env_id} is a game: it takes game calls, not {message.type!r}")
        return {"type": "game", "data": _game_call(instance, message)}
    if message.type in GAME_CALLS:
        raise _Refused(UNKNOWN_TYPE, f"{served.env_id} is a {served.kind}, not a game: no {message.type!r} here")
    kind = "chat_agent" if isinstance(instance, ChatAgent) else "env"
    wanted = "run" if kind == "chat_agent" else "reset' or 'step"
    if (message.type == "run") != (kind == "chat_agent"):
        raise _Refused(UNKNOWN_TYPE, f"{served.env_id} is a {kind}: it takes '{wanted}' messages, not {message.type!r}")
    if message.type == "reset":
        state = await instance.reset(message.data.model_dump())
        if not isinstance(state, dict) or "observation" not in state:
            raise TypeError(f"Env.reset must return a dict with an 'observation', got {state!r:.120}")
        state = {**state, "images": no_images(state.get("images"), "the state Env.reset returned")}
        ResetState.model_validate(state)
        return {"type": "observation", "data": {"observation": state, "reward": None, "done": False}}
    if message.type == "step":
        result = await instance.step(step_state(message.data))
        if not isinstance(result, Result):
            raise TypeError(f"Env.step must return a molt_envs.Result, got {type(result).__name__}")
        return result_message(result)
    result = await instance.run(_chat_context(message.data))
    if not isinstance(result, Result):
        raise TypeError(f"ChatAgent.run must return a molt_envs.Result, got {type(result).__name__}")
    return result_message(result)


def _game_call(game: Any, message: Any) -> dict[str, Any]:
    """One call of a ``molt_envs.seats.Game`` (duck-typed: this module imports nothing of ``seats``). Game methods
    are synchronous and run here, on the env loop, one at a time: a game may swap process-wide state around its
    calls (TextArena's module-level ``random``), which threads would interleave."""
    data, kind = message.data, message.type
    if kind == "game":
        return {
            "setup": {
                "seats": list(game.seats),
                "mode": game.mode,
                "opponent": game.opponent,
                "seat_policies": dict(game.seat_policies),
            }
        }
    answer: dict[str, Any] = {}
    if kind == "game_reset":
        game.reset(data.seed)
    elif kind == "observe":
        return {"messages": game.observe(data.seat, first=data.first)}
    elif kind == "returns":
        return {"returns": game.returns()}
    elif kind == "info":
        return {"info": game.info(data.seat)}
    elif kind == "play_text":
        answer["going"] = bool(game.play_text(data.seat, data.text))
    elif kind == "play_policy":
        if data.policy == "model" or data.policy.startswith("checkpoint:"):
            raise _Refused(
                VALIDATION_ERROR,
                f"play_policy plays scripted seats only ('random' or 'pkg.mod:fn'), not {data.policy!r}: the "
                "client generates a model's or a checkpoint's move and sends it as play_text",
            )
        rng = random.Random()
        version, internal, gauss = data.rng_state
        rng.setstate((version, tuple(internal), gauss))
        answer["going"] = bool(game.play_policy(data.seat, game.scripted(data.policy), rng))
        version, internal, gauss = rng.getstate()
        answer["rng_state"] = [version, list(internal), gauss]
    answer["to_move"] = game.to_move()
    return answer


def _chat_context(run: ChatRun) -> ChatContext:
    return ChatContext(
        messages=run.messages,
        tools=run.tools,
        prompt=run.prompt,
        label=run.label,
        images=None,
        base_url=run.base_url,
        session_url=run.session_url,
        model_name=run.model_name,
        api_key=run.api_key,
        session_id=run.session_id,
        sampling_params=SamplingParams(**run.sampling_params),
        max_length=run.max_length,
    )


async def _close(instance: Any) -> dict[str, Any]:
    close = getattr(instance, "close", None)  # ChatAgent has no close; a Game's is synchronous
    try:
        if close is not None and inspect.isawaitable(closing := close()):
            await closing
    except Exception as exc:
        return error_message(EXECUTION_ERROR, _describe(exc), type(exc).__name__)
    return {"type": "closed", "data": {}}


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _summary(exc: ValidationError) -> str:
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "(message)"
    more = f" (+{exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"{where}: {first['msg']}{more}"


def serve(
    app: FastAPI,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    on_ready: Callable[[str], None] | None = None,
    exit_on_stdin_eof: bool = False,
) -> None:
    """Run ``app`` with uvicorn until interrupted; ``on_ready(base_url)`` once it accepts connections (``port=0``
    picks a free port). ``exit_on_stdin_eof``: stop when standard input closes, i.e. when the parent that started
    this server dies, however it dies.

    Raises:
        OSError: the address cannot be bound (the port is taken, or the host is not this machine's).
    """
    import uvicorn

    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port}: {exc.strerror or exc}; pick another --port") from None
    bound = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", ws="websockets-sansio", lifespan="off", timeout_keep_alive=30)
    server = uvicorn.Server(config)
    if exit_on_stdin_eof:
        threading.Thread(target=_stop_at_eof, args=(server,), daemon=True, name="stdin-watch").start()

    async def run() -> None:
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started and not task.done():
            await asyncio.sleep(0.01)
        if server.started and on_ready is not None:
            on_ready(f"http://{f'[{host}]' if ':' in host else host}:{bound}")
        await task

    try:
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            runner.run(run())
    finally:
        sock.close()


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop when it is installed (what uvicorn's ``loop="auto"`` picks), else asyncio's default loop."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def _stop_at_eof(server: Any) -> None:
    with contextlib.suppress(Exception):
        while sys.stdin.buffer.read(4096):
            pass
    server.should_exit = True
