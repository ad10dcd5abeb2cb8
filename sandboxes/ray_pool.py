"""The `ray` provider: executions spread over Ray actors, each owning a local jail pool on its node,
so throughput grows with the cluster. Calls go to the least-busy actor; when every actor's workers
are busy, calls queue inside the actors (back-pressure). Actor i goes to the i-th alive node (round-robin, the
caller's first), so the executions spread over the cluster. An actor that died or became unreachable (its node
lost: Ray says "unavailable" until it marks the node dead, which takes a health check's seconds) is an infra_error
for the calls it had, and a new actor takes its place on another alive node at once, so calls stop going to it."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading

from sandboxes.limits import Limits
from sandboxes.result import Result

_started_ray = False  # whether a RayBackend called ray.init (then the last one to close stops Ray)
_live: set[int] = set()
SESSION_POLL_S = 1.0  # how long one open_session call waits in an actor for a session slot before asking again


def _pick_node(index: int, avoid: str | None = None) -> str:
    """The ``index``-th alive node (round-robin, the caller's first), never ``avoid`` (a node just lost)."""
    import ray

    here = ray.get_runtime_context().get_node_id()
    alive = sorted(
        sorted(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeID"] != avoid), key=lambda n: n != here
    )
    return alive[index % len(alive)] if alive else here


class _SandboxActor:
    """Runs in a Ray worker process; wraps a local pool (blocking calls, threaded actor)."""

    def __init__(self, unsafe: bool, limits: Limits, pool_options: dict) -> None:
        from sandboxes.local import make_pool

        self.pool = make_pool(unsafe=unsafe, limits=limits, **pool_options)
        self.sessions: dict = {}
        self._ids = itertools.count()

    def ready(self) -> str:
        import socket

        return socket.gethostname()

    def run(self, header: dict, payload: dict, limits: Limits) -> Result:
        return asyncio.run(self.pool.run_async(header, limits, payload))  # a threaded actor: a loop per call

    def open_session(self, wait_s: float | None = None) -> int | None:
        """A new session's id, or None when no session slot freed up within `wait_s` (the caller asks again: a
        thread of this actor never blocks for long, so closes and calls of other sessions always find one)."""
        from sandboxes.pool import PoolSession

        taken = self.pool.dedicated(wait_s)
        if taken is None:
            return None
        slot, worker = taken
        sid = next(self._ids)
        self.sessions[sid] = PoolSession(self.pool, slot, worker)
        return sid

    def session_call(self, sid: int, header: dict, payload: dict | None, limits: Limits) -> Result | dict:
        return self.sessions[sid].call_blocking(header, payload, limits)

    def abandon_session_call(self, sid: int) -> None:
        """Kill the worker of a session whose caller gave up on its call (cancelled): the call on the other thread
        ends at once (infra_error, the state lost) and the session's next call starts a fresh worker."""
        session = self.sessions.get(sid)
        worker = session.worker if session is not None else None
        if worker is not None:
            self.pool.stats["abandoned"] += 1
            worker.kill()

    def close_session(self, sid: int) -> None:
        session = self.sessions.pop(sid, None)
        if session is not None:  # its slot goes back even when its worker died (it has none then)
            session.close_blocking()

    def stats(self) -> dict:
        return dict(self.pool.stats)

    def shutdown(self) -> None:
        self.pool.close()


class RayBackend:
    """`sandboxes.open("ray", actors=2, workers_per_actor=1, address=None, ...)`."""

    name = "ray"

    def __init__(
        self,
        *,
        unsafe: bool = False,
        limits: Limits | None = None,
        actors: int | None = None,
        workers_per_actor: int = 1,
        address: str | None = None,
        **pool_options: object,
    ) -> None:
        import ray

        global _started_ray
        self._ray = ray
        if not ray.is_initialized():
            if address is None:
                ray.init(
                    num_cpus=2,
                    include_dashboard=False,
                    log_to_driver=False,
                    object_store_memory=80 << 20,
                    configure_logging=False,
                )
            else:
                ray.init(address=address, log_to_driver=False)
            _started_ray = True
        _live.add(id(self))
        count = actors or max(1, len([n for n in ray.nodes() if n.get("Alive")]))
        options = {"num_cpus": 0, "max_concurrency": workers_per_actor + 34}
        args = (unsafe, limits or Limits(), {**pool_options, "workers": workers_per_actor})
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        def spawn(index: int, avoid: str | None = None) -> object:
            # hard: a soft affinity may spill to another node, piling the actors up; a node that is gone by the time
            # the actor is scheduled fails its calls (ActorUnschedulableError), and then the actor is replaced
            self.placed[index] = node = _pick_node(index, avoid)
            strategy = NodeAffinitySchedulingStrategy(node, soft=False)
            return ray.remote(_SandboxActor).options(**options, scheduling_strategy=strategy).remote(*args)

        self._spawn, self.placed = spawn, [""] * count
        self.actors = [spawn(i) for i in range(count)]
        try:
            self.nodes = ray.get([actor.ready.remote() for actor in self.actors], timeout=120)
        except Exception as exc:  # surface the actor's own reason (e.g. SandboxUnavailable)
            self.close()
            raise exc from None
        self._inflight = [0] * count
        self._lock = threading.Lock()

    def _pick(self) -> int:
        with self._lock:
            index = min(range(len(self.actors)), key=self._inflight.__getitem__)
            self._inflight[index] += 1
            return index

    async def run(self, header: dict, payload: dict, limits: Limits) -> Result:
        index = self._pick()
        actor = self.actors[index]
        try:
            result = await actor.run.remote(header, payload, limits)
            result.provider = self.name
            return result
        except self._ray.exceptions.RayError as exc:
            self._replace_if_dead(index, actor, exc)
            return Result.infra(f"ray actor {index} failed: {exc}", self.name, 1)
        finally:
            with self._lock:
                self._inflight[index] -= 1

    def _replace_if_dead(self, index: int, actor: object, exc: Exception) -> None:
        """A new actor in place of ``actor`` when ``exc`` says it is gone: died, unreachable or never placed (not
        when one call failed). An unreachable one is killed, in case it comes back, so it holds no pool."""
        errors = self._ray.exceptions
        if not isinstance(exc, (errors.RayActorError, errors.ActorUnschedulableError)):
            return
        with self._lock:
            if self.actors[index] is not actor:  # another call has replaced it already
                return
            self.actors[index] = self._spawn(index, avoid=self.placed[index])
        with contextlib.suppress(Exception):  # dead already
            self._ray.kill(actor, no_restart=True)

    async def open_session(self) -> RaySession:
        """A session on the least busy actor; while all of that actor's sessions are open, waits in its queue (asking
        again every second). Cancelled meanwhile, a session the actor opened anyway is closed."""
        index = self._pick()
        actor = self.actors[index]
        try:
            while True:
                ref = actor.open_session.remote(SESSION_POLL_S)
                try:
                    sid = await ref
                except asyncio.CancelledError:
                    ref.future().add_done_callback(lambda done: _close_unwanted(actor, done))
                    raise
                if sid is not None:
                    return RaySession(self, index, sid, actor)
        except BaseException as exc:
            with self._lock:
                self._inflight[index] -= 1
            if isinstance(exc, self._ray.exceptions.RayError):
                self._replace_if_dead(index, actor, exc)
            raise

    def stats(self) -> list[dict]:
        return self._ray.get([actor.stats.remote() for actor in self.actors])

    def close(self) -> None:
        """Stop this backend's actors; the last backend to close stops Ray if we started it."""
        global _started_ray
        ray = self._ray
        if ray.is_initialized():  # any Ray call on a stopped instance would start a new one
            for actor in self.actors:
                with contextlib.suppress(Exception):  # already dead: nothing to stop
                    ray.get(actor.shutdown.remote(), timeout=30)
                    if not _started_ray:  # on a shared cluster, free the actor now
                        ray.kill(actor)
        self.actors = []
        _live.discard(id(self))
        if not _live and _started_ray:
            _started_ray = False
            ray.shutdown()


def _close_unwanted(actor: object, done: object) -> None:
    """A session an actor opened for a caller that was cancelled meanwhile: close it."""
    with contextlib.suppress(Exception):
        sid = done.result()
        if sid is not None:
            actor.close_session.remote(sid)


class RaySession:
    def __init__(self, backend: RayBackend, index: int, sid: int, actor: object) -> None:
        self.backend = backend
        self.index = index
        self.sid = sid
        self.actor = actor  # the session's worker lives in this actor, even after a replacement at ``index``

    async def call(self, header: dict, payload: dict | None, limits: Limits) -> Result | dict:
        try:
            reply = await self.actor.session_call.remote(self.sid, header, payload, limits)
            if isinstance(reply, Result):
                reply.provider = self.backend.name
            return reply
        except asyncio.CancelledError:  # the caller gave up: kill the call's worker rather than let it run on
            self.actor.abandon_session_call.remote(self.sid)
            raise
        except self.backend._ray.exceptions.RayError as exc:
            self.backend._replace_if_dead(self.index, self.actor, exc)
            return Result.infra(f"ray actor {self.index} failed: {exc}", self.backend.name, 1)

    async def close(self) -> None:
        try:
            with contextlib.suppress(self.backend._ray.exceptions.RayActorError):  # its actor died with its state
                await self.actor.close_session.remote(self.sid)
        finally:
            with self.backend._lock:
                self.backend._inflight[self.index] -= 1
        await asyncio.sleep(0)
