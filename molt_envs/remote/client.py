"""The env protocol's client: ``RemoteEnv`` and ``RemoteChatAgent``, ordinary contract objects driving a served env,
and ``GameSession``, a served game's calls made synchronously (what ``env_registry.remote.RemoteGame`` drives).

The runners keep owning the LLM loop and the token-exact trajectory; only ``reset``/``step``/``close`` (or a chat
agent's ``run``) cross the wire, one WebSocket per episode. A failure of the wire itself raises an
``EnvServerError`` whose ``failure_stage`` the runners put first in ``Trajectory.failure`` (so it is counted as
``rollout/dropped/failure_<stage>``): ``remote_connect`` (no server there), ``remote_lost`` (the connection broke
mid-episode), ``remote_timeout`` (no answer in time), ``remote_protocol`` (an answer that is not the protocol's).
After each, the endpoint's ``recover`` runs (a managed server is checked and restarted there). The env's own
failures come back as ``RemoteEnvError`` and keep the runner's stage, as they would in process.

Nothing hangs on a dead server: each WebSocket pings the server every ``$MOLT_ENV_PING_INTERVAL_S`` (2 s) and
counts it lost when a pong takes over ``$MOLT_ENV_PING_TIMEOUT_S`` (4 s), so a server killed, stopped
(``SIGSTOP``) or cut off fails its episodes as ``remote_lost`` within seconds, not at the 300 s answer timeout (the
server answers pings while its envs' code runs: ``molt_envs.remote.server.EnvLoop``). An episode the caller
abandons (its task cancelled: a deadline, a stopped run) drops its WebSocket at once, and the server then cancels
the call in flight and closes the instance. An endpoint whose server takes at most N episodes at once (``serve-env
--max-episodes N``: its metadata's ``max_episodes``) lets N open at a time; later ones wait here for a slot
(``EpisodeSlots``, counted in ``Endpoint.stats`` and ``wire_stats()``), not in the server's queue, where the wait
would run down their first answer's timeout.
"""

from __future__ import annotations

import asyncio
import collections
import os
import threading
import time
from collections.abc import Coroutine
from typing import Any
from urllib.parse import quote, urlsplit

from pydantic import TypeAdapter, ValidationError
from websockets.asyncio.client import connect
from websockets.exceptions import WebSocketException

from molt_envs.contract import ChatAgent, ChatContext, Env, Result, StepState
from molt_envs.remote.protocol import (
    CLOSE_REPLY,
    EXECUTION_ERROR,
    FACTORY_ERROR,
    GAME_REPLY,
    PROTOCOL,
    PROTOCOL_VERSION,
    RESET_REPLY,
    STEP_REPLY,
    answer_result,
    dumps,
    no_images,
    sampling_dict,
    step_message,
)

TIMEOUT_S = float(os.environ.get("MOLT_ENV_TIMEOUT_S", "300"))  # one reset/step/run answer
# keepalive: a ping every interval; no pong within the timeout (then a close of at most CLOSE_TIMEOUT_S) = lost
PING_INTERVAL_S = float(os.environ.get("MOLT_ENV_PING_INTERVAL_S", "2"))  # 0: no pings
PING_TIMEOUT_S = float(os.environ.get("MOLT_ENV_PING_TIMEOUT_S", "4"))
CLOSE_TIMEOUT_S = 1.0
# the longest an episode waits for a free slot of a server at capacity (not its answers' timeout: the queue may be long)
SLOT_TIMEOUT_S = float(os.environ.get("MOLT_ENV_SLOT_TIMEOUT_S", "600"))
# the opening handshake: a server that accepts the TCP connection (the kernel does, even for a stopped process) but
# does not answer the upgrade within this long is dead to us (keepalive only starts once the socket is open)
CONNECT_TIMEOUT_S = float(os.environ.get("MOLT_ENV_CONNECT_TIMEOUT_S", "10"))
MAX_MESSAGE_BYTES = 64 << 20
LOOPBACK = {"127.0.0.1", "localhost", "::1"}


class EnvServerError(Exception):
    """The wire to an env server failed; ``failure_stage`` names how (see the module docstring)."""

    failure_stage = "remote"


class ServerUnreachable(EnvServerError):
    """No env server answered at the endpoint's address."""

    failure_stage = "remote_connect"


class ServerLost(EnvServerError):
    """The connection to the env server broke mid-episode (the server died, or the network went away)."""

    failure_stage = "remote_lost"


class ServerTimeout(EnvServerError):
    """The env server did not answer in time."""

    failure_stage = "remote_timeout"


class ProtocolViolation(EnvServerError):
    """The env server answered something that is not the protocol's answer (or refused our message as malformed)."""

    failure_stage = "remote_protocol"


class RemoteEnvError(Exception):
    """The served env raised; the message is the server's ``ExceptionType: message``. A failure making the
    instance is stage ``make``, as in process; others keep the runner's stage."""

    def __init__(self, message: str, exception: str | None, failure_stage: str | None = None) -> None:
        super().__init__(message)
        self.exception = exception
        self.failure_stage = failure_stage


_STATS_LOCK = threading.Lock()
_STATS = {"slot_waits": 0, "slot_wait_s": 0.0}


def wire_stats() -> dict[str, float]:
    """This process's counters over every endpoint, monotonic (a caller reports their change over a batch):
    ``slot_waits``, episodes that waited for a free slot of their server, and ``slot_wait_s``, the seconds they
    waited in all."""
    with _STATS_LOCK:
        return dict(_STATS)


class EpisodeSlots:
    """At most ``capacity`` episodes open at once (``None``: no bound); the others wait in line for a slot, from any
    event loop or thread (a ``GameSession`` opens its episodes on a loop of its own). ``stats`` counts the waits."""

    def __init__(self, capacity: int | None) -> None:
        self.capacity = capacity
        self.in_use = 0
        self.stats = {"slot_waits": 0, "slot_wait_s": 0.0}
        self._lock = threading.Lock()
        self._waiters: collections.deque[list[Any]] = collections.deque()  # [loop, future, granted]

    def resize(self, capacity: int | None) -> None:
        """A new bound (the server restarted with another); slots held now stay held."""
        with self._lock:
            self.capacity = capacity
            self._hand_over()

    async def acquire(self, timeout_s: float) -> bool:
        """Take a slot, waiting at most ``timeout_s``; False if none came free in time."""
        with self._lock:
            if not self._waiters and (self.capacity is None or self.in_use < self.capacity):
                self.in_use += 1
                return True
            loop = asyncio.get_running_loop()
            waiter = [loop, loop.create_future(), False]
            self._waiters.append(waiter)
        start = time.monotonic()
        try:
            async with asyncio.timeout(timeout_s):
                await waiter[1]
        except BaseException as exc:
            with self._lock:
                granted = waiter[2]
                if not granted:
                    self._waiters.remove(waiter)
            if granted:  # handed a slot as it gave up: pass it on
                self.release()
            if not isinstance(exc, TimeoutError):
                raise
            self._count(time.monotonic() - start)
            return False
        self._count(time.monotonic() - start)
        return True

    def release(self) -> None:
        """Give a slot back (to the next in line, if any)."""
        with self._lock:
            self.in_use -= 1
            self._hand_over()

    def _hand_over(self) -> None:  # (under the lock)
        while self._waiters and (self.capacity is None or self.in_use < self.capacity):
            waiter = self._waiters.popleft()
            try:
                waiter[0].call_soon_threadsafe(_grant, waiter[1])
            except RuntimeError:  # its loop is closed: nobody waits there any more
                continue
            waiter[2] = True
            self.in_use += 1

    def _count(self, waited_s: float) -> None:
        with _STATS_LOCK:
            self.stats["slot_waits"] += 1
            self.stats["slot_wait_s"] += waited_s
            _STATS["slot_waits"] += 1
            _STATS["slot_wait_s"] += waited_s


def _grant(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


class Endpoint:
    """Where a served env lives: ``base_url`` (``http://host:port``) and the env ID under it.

    ``recover(generation)`` runs after a wire failure of a connection opened at ``generation``; here it does
    nothing (a server someone else runs is theirs to restart); ``env_registry`` overrides it for the servers it
    starts. ``ws_url()`` may wait for a restart in progress. ``capacity``: the server's ``max_episodes``, if it has
    one: at most that many episodes open at once, the others wait (``slots``; ``stats["slot_waits"]`` and
    ``stats["slot_wait_s"]`` count them; at most ``slot_timeout_s``). ``ping_interval_s`` / ``ping_timeout_s``: the
    keepalive of its WebSockets.
    """

    def __init__(
        self, base_url: str, env_id: str, *, timeout_s: float = TIMEOUT_S, capacity: int | None = None
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.env_id = env_id
        self.timeout_s = timeout_s
        self.generation = 0
        self.slots = EpisodeSlots(capacity)
        self.slot_timeout_s = SLOT_TIMEOUT_S
        self.ping_interval_s = PING_INTERVAL_S
        self.ping_timeout_s = PING_TIMEOUT_S

    @property
    def stats(self) -> dict[str, float]:
        """This endpoint's counters: ``slot_waits`` (episodes that waited for a slot), ``slot_wait_s`` (seconds)."""
        return self.slots.stats

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.base_url}/{self.env_id})"

    async def ws_url(self) -> str:
        base = "ws" + self.base_url[len("http") :]
        return f"{base}/{quote(self.env_id)}/ws?protocol={PROTOCOL_VERSION}"

    async def recover(self, generation: int, wait: bool = True) -> None:
        """After a wire failure of a connection opened at ``generation``: make the endpoint usable again (``wait``:
        return once that is done; else once it has begun, episodes opening meanwhile wait in ``ws_url``)."""
        return None


class _Episode:
    """One WebSocket: send a message, wait for its answer, classify every way that can fail."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.ws: Any = None
        self.generation = 0
        self.broken = False  # a call did not complete: the connection's state is unknown
        self.slot = False  # holds one of the endpoint's slots

    async def open(self) -> None:
        endpoint = self.endpoint
        if not await endpoint.slots.acquire(endpoint.slot_timeout_s):
            raise ServerTimeout(
                f"{endpoint} had no free episode slot within {endpoint.slot_timeout_s:g} s (the server takes "
                f"{endpoint.slots.capacity} episodes at once; set MOLT_ENV_SLOT_TIMEOUT_S to wait longer)"
            )
        self.slot = True
        try:
            await self._connect()
        except BaseException:
            self.drop()
            raise

    async def _connect(self) -> None:
        url = await self.endpoint.ws_url()
        self.generation = self.endpoint.generation
        # no proxy on loopback (looking one up reads the whole environment: a third of a connect's CPU)
        proxy = None if urlsplit(url).hostname in LOOPBACK else True
        interval = self.endpoint.ping_interval_s or None
        try:
            self.ws = await connect(
                url,
                compression=None,
                open_timeout=CONNECT_TIMEOUT_S,
                max_size=MAX_MESSAGE_BYTES,
                ping_interval=interval,
                ping_timeout=self.endpoint.ping_timeout_s if interval else None,
                close_timeout=CLOSE_TIMEOUT_S,
                proxy=proxy,
            )
        except asyncio.CancelledError:  # abandoned while the server had not answered the handshake: check it
            await self.endpoint.recover(self.generation, wait=False)
            raise
        except Exception as exc:  # refused, DNS, TLS, an HTTP answer that is no WebSocket upgrade, timeout
            await self.endpoint.recover(self.generation, wait=False)
            raise ServerUnreachable(
                f"cannot open an episode at {url}: {type(exc).__name__}: {exc}; is `molt-env serve-env "
                f"{self.endpoint.env_id}` running there?"
            ) from None

    async def call(self, message: dict[str, Any], reply: TypeAdapter[Any], what: str) -> Any:
        if self.ws is None:
            await self.open()
        text = dumps(message)  # a TypeError/ValueError here is the caller's value: it keeps the runner's stage
        self.broken = True
        try:
            await self.ws.send(text)
            async with asyncio.timeout(self.endpoint.timeout_s):  # no task per call, unlike wait_for
                raw = await self.ws.recv()
        except asyncio.CancelledError:  # abandoned (a deadline, a stop): the server cancels the call when we drop
            self.drop()
            await self.endpoint.recover(self.generation, wait=False)  # and it is checked (in the background)
            raise
        except TimeoutError:
            await self._fail()
            raise ServerTimeout(
                f"{self.endpoint} did not answer {what!r} within {self.endpoint.timeout_s:g} s "
                "(set MOLT_ENV_TIMEOUT_S or ?timeout_s= on the URL for slower envs)"
            ) from None
        except (OSError, EOFError, WebSocketException) as exc:  # WebSocketException: ConnectionClosed and kin
            await self._fail()
            raise ServerLost(f"{self.endpoint}: the connection broke during {what!r}: {_why(exc)}") from None
        self.broken = False
        try:
            answer = reply.validate_json(raw)
        except ValidationError as exc:
            await self._fail()
            raise ProtocolViolation(
                f"{self.endpoint} answered {what!r} with {_clip(raw)}, which is not {PROTOCOL}: "
                f"{exc.errors()[0]['msg']} at {'.'.join(map(str, exc.errors()[0]['loc'])) or '(top)'}"
            ) from None
        if answer.type == "error":
            data = answer.data
            if data.code in (EXECUTION_ERROR, FACTORY_ERROR):
                raise RemoteEnvError(data.message, data.exception, "make" if data.code == FACTORY_ERROR else None)
            await self._fail()
            raise ProtocolViolation(f"{self.endpoint} refused {what!r}: {data.code}: {data.message}")
        return answer

    async def _fail(self) -> None:
        self.drop()  # (a broken connection: no closing handshake to wait for)
        await self.endpoint.recover(self.generation, wait=False)

    async def close(self) -> None:
        """Say ``close`` (the server closes the instance; its failure is raised here) unless the connection is
        already unusable, then close the socket."""
        if self.ws is None:
            return
        try:
            if not self.broken:
                await self.call({"type": "close", "data": {}}, CLOSE_REPLY, "close")
        finally:
            await self.abort()

    async def abort(self) -> None:
        """Close the socket (briefly waiting for the server's close frame) and give the slot back."""
        ws, self.ws = self.ws, None
        try:
            if ws is not None:
                try:
                    await asyncio.wait_for(ws.close(), 1.0)
                except Exception:
                    ws.transport.abort()
        finally:
            self.drop()

    def drop(self) -> None:
        """Cut the connection now (the server sees it go and closes the instance) and give the slot back."""
        ws, self.ws = self.ws, None
        if ws is not None:
            ws.transport.abort()
        if self.slot:
            self.slot = False
            self.endpoint.slots.release()


class RemoteEnv(Env):
    """An ``Env`` whose instance lives in an env server; one per episode, like any ``Env``."""

    def __init__(self, endpoint: Endpoint) -> None:
        self._episode = _Episode(endpoint)

    async def reset(self, state: dict[str, Any]) -> dict[str, Any]:
        message = {
            "type": "reset",
            "data": {**state, "images": no_images(state.get("images"), "the reset state")},
        }
        answer = await self._episode.call(message, RESET_REPLY, "reset")
        return {**answer.data.observation.model_dump(), "images": []}

    async def step(self, state: StepState) -> Result:
        answer = await self._episode.call(step_message(state), STEP_REPLY, "step")
        return answer_result(answer.data)

    async def close(self) -> None:
        await self._episode.close()


class RemoteChatAgent(ChatAgent):
    """A ``ChatAgent`` that runs in an env server: it calls the policy at ``ctx.base_url``, so the server must reach
    that address (the trainer's session server listens on loopback: same machine only)."""

    def __init__(self, endpoint: Endpoint) -> None:
        self._episode = _Episode(endpoint)

    async def run(self, ctx: ChatContext) -> Result:
        data = {
            "messages": ctx.messages,
            "tools": ctx.tools,
            "prompt": ctx.prompt,
            "label": ctx.label,
            "images": no_images(ctx.images, "the chat context"),
            "base_url": ctx.base_url,
            "session_url": ctx.session_url,
            "model_name": ctx.model_name,
            "api_key": ctx.api_key,
            "session_id": ctx.session_id,
            "sampling_params": sampling_dict(ctx.sampling_params),
            "max_length": ctx.max_length,
        }
        try:
            answer = await self._episode.call({"type": "run", "data": data}, STEP_REPLY, "run")
            result = answer_result(answer.data)
        except BaseException:
            await self._episode.abort()
            raise
        await self._episode.close()
        return result


class _Bridge:
    """One daemon thread running an event loop, where the synchronous callers' WebSockets live (``GameSession``)."""

    _loop: asyncio.AbstractEventLoop | None = None
    _pid = 0  # a forked child has the loop but not its thread: it starts its own
    _lock = threading.Lock()

    @classmethod
    def run(cls, coro: Coroutine[Any, Any, Any]) -> Any:
        with cls._lock:
            if cls._loop is None or cls._pid != os.getpid():
                cls._loop, cls._pid = asyncio.new_event_loop(), os.getpid()
                threading.Thread(target=cls._loop.run_forever, daemon=True, name="molt-env-sync-bridge").start()
            loop = cls._loop
        return asyncio.run_coroutine_threadsafe(coro, loop).result()


class GameSession:
    """A served game's session over one WebSocket, driven synchronously (``molt_envs.seats.Game``'s methods are
    sync and called from inside the runner's event loop, so the calls go through a thread of their own and block
    their caller for one round trip each, as the game's own code would in process). ``call(type, data)`` returns
    the ``GameAnswer``; failures raise as ``RemoteEnv``'s do. ``env_registry.remote.RemoteGame`` is the ``Game``
    over it (this package imports nothing of ``seats``)."""

    def __init__(self, endpoint: Endpoint) -> None:
        self._episode = _Episode(endpoint)

    def call(self, kind: str, data: dict[str, Any] | None = None) -> Any:
        message = {"type": kind, "data": data or {}}
        return _Bridge.run(self._episode.call(message, GAME_REPLY, kind)).data

    def close(self) -> None:
        _Bridge.run(self._episode.close())


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _clip(raw: Any, limit: int = 200) -> str:
    text = raw if isinstance(raw, str) else f"a binary frame of {len(raw)} bytes"
    return repr(text[:limit]) + (" ..." if len(text) > limit else "")
