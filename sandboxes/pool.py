"""A fixed-size pool of warm workers shared by many sandbox sessions.

`run_async` serves one-shot executions from an event loop (any loop: a thread without one runs it
under `asyncio.run`), keeping blocking steps (spawning and killing workers, cgroup writes) on the
pool's threads. Callers queue when every worker is busy (back-pressure), and so do persistent
sessions past the pool's `max_sessions` (a FIFO queue: opening one never fails for capacity). Workers
start lazily, are recycled after `recycle_after` executions or when they report an unhealthy sweep,
and are replaced after any transport failure; such a failure is retried once on a fresh worker and
otherwise reported as "infra_error".

Cancellation: a caller cancelled while its request is on a worker's channel (an episode past its
deadline) abandons the execution. That worker is killed at once (its jail and everything in it) and
its slot handed on, to a fresh worker started lazily; a session's next call gets a fresh REPL.

`WorkerPool.stats` counts, besides executions and failures, the waits: ``slot_waits`` and
``slot_wait_s`` (one-shot calls that found every worker busy, and the seconds they queued),
``session_waits`` and ``session_wait_s`` (persistent sessions opened past capacity), and
``abandoned`` (executions cut short by their caller's cancellation).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from sandboxes.errors import WorkerDied
from sandboxes.limits import Limits
from sandboxes.result import Result
from sandboxes.worker import Worker

WorkerFactory = Callable[[int, bool], Worker]  # (slot id, persistent) -> started worker


class IdleSlots:
    """The idle worker slots, first in first out (a worker gets time to clean up). Taken by threads
    (`get`, blocking) or by coroutines of any event loop (`get_async`); both queue while none is idle."""

    def __init__(self, slots: range) -> None:
        self._idle = deque(slots)
        self._waiters: deque[tuple[asyncio.AbstractEventLoop | None, Future]] = deque()
        self._lock = threading.Lock()

    def try_get(self) -> int | None:
        """An idle slot now, or None when none is (never waits)."""
        with self._lock:
            return self._idle.popleft() if self._idle else None

    @property
    def idle(self) -> int:
        """How many slots are idle now."""
        return len(self._idle)

    @property
    def waiting(self) -> int:
        """How many callers are queued for a slot now."""
        return len(self._waiters)

    def get(self, timeout: float | None = None) -> int | None:
        """An idle slot, waiting (blocking) in line while none is; None if `timeout` seconds pass first."""
        with self._lock:
            if self._idle:
                return self._idle.popleft()
            waiter: Future = Future()
            self._waiters.append((None, waiter))
        try:
            return waiter.result(timeout)
        except TimeoutError:
            with self._lock:
                if (None, waiter) in self._waiters:  # still in line: leave it
                    self._waiters.remove((None, waiter))
                    return None
            return waiter.result()  # handed over meanwhile: ours

    async def get_async(self) -> int:
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._idle:
                return self._idle.popleft()
            waiter = loop.create_future()
            self._waiters.append((loop, waiter))
        try:
            return await waiter
        except asyncio.CancelledError:
            with self._lock:
                handed = (loop, waiter) not in self._waiters
                if not handed:
                    self._waiters.remove((loop, waiter))
            if handed and waiter.done() and not waiter.cancelled():
                self.put(waiter.result())  # handed over, but we no longer want it
            raise

    def put(self, slot: int) -> None:
        with self._lock:
            if not self._waiters:
                self._idle.append(slot)
                return
            loop, waiter = self._waiters.popleft()
        if loop is None:
            waiter.set_result(slot)
            return
        try:
            loop.call_soon_threadsafe(self._hand_over, waiter, slot)
        except RuntimeError:  # that loop is closed: its waiter is gone
            self.put(slot)

    def _hand_over(self, waiter: asyncio.Future, slot: int) -> None:
        if waiter.cancelled():
            self.put(slot)
        else:
            waiter.set_result(slot)


class WorkerPool:
    """Warm workers for one-shot executions (`size` of them) plus up to `max_sessions` dedicated workers, one
    per open persistent session. Both kinds of slot are handed out first come, first served."""

    def __init__(
        self, provider: str, factory: WorkerFactory, size: int, recycle_after: int = 500, max_sessions: int = 32
    ) -> None:
        if size < 1:
            raise ValueError(f"workers={size!r}: a pool needs at least one worker")
        self.provider = provider
        self.size = size
        self.recycle_after = recycle_after
        self._factory = factory
        self._idle = IdleSlots(range(size))
        self._workers: dict[int, Worker | None] = dict.fromkeys(range(size))
        self.max_sessions = max_sessions
        self._session_slots = IdleSlots(range(size, size + max_sessions))
        self._dying: dict[Worker, Future] = {}  # abandoned workers being killed, until they are gone
        self._lock = threading.Lock()
        self._closed = False
        self.executor = ThreadPoolExecutor(
            max_workers=size + max_sessions + 4, thread_name_prefix=f"sandboxes-{provider}"
        )
        self.stats: dict[str, int | float] = {
            "executions": 0,
            "infra_errors": 0,
            "retries": 0,
            "respawns": 0,
            "abandoned": 0,
            "slot_waits": 0,
            "slot_wait_s": 0.0,
            "session_waits": 0,
            "session_wait_s": 0.0,
        }

    async def _take(self, slots: IdleSlots, kind: str) -> int:
        """A slot of `slots`, queueing (FIFO) while none is idle; a wait is counted in ``<kind>_waits`` and
        ``<kind>_wait_s``. A caller cancelled while queued leaves the queue (a slot handed to it goes on)."""
        slot = slots.try_get()
        if slot is not None:
            return slot
        start = time.monotonic()
        try:
            return await slots.get_async()
        finally:
            self.stats[f"{kind}_waits"] += 1
            self.stats[f"{kind}_wait_s"] += time.monotonic() - start

    def _take_blocking(self, slots: IdleSlots, kind: str, timeout_s: float | None = None) -> int | None:
        slot = slots.try_get()
        if slot is not None:
            return slot
        start = time.monotonic()
        try:
            return slots.get(timeout_s)
        finally:
            self.stats[f"{kind}_waits"] += 1
            self.stats[f"{kind}_wait_s"] += time.monotonic() - start

    def retire(self, worker: Worker) -> Future:
        """Kill an abandoned worker now (its jail and all in it) and tear it down, on a thread of its own; the
        returned future is done once it is gone. `close` waits for those still dying."""
        done: Future = Future()

        def finish() -> None:
            try:
                worker.kill()
                worker.close()
            finally:
                with self._lock:
                    self._dying.pop(worker, None)
                done.set_result(None)

        with self._lock:
            self._dying[worker] = done
        self.stats["abandoned"] += 1
        threading.Thread(target=finish, name=f"sandboxes-{self.provider}-retire", daemon=True).start()
        return done

    # ---- one-shot executions -------------------------------------------------------------
    async def run_async(self, request: dict, limits: Limits, payload: dict | None = None) -> Result:
        """One execution served from the event loop: the request and reply travel on the loop
        (workers with `async_io`), only blocking steps (spawn, kill, cgroup writes) go to threads.
        Queues (FIFO) while every worker is busy. Cancelling the caller abandons the execution: a
        worker already running it is killed at once and the slot handed on (a fresh worker starts
        for the next call); a blocking step in flight (a spawn) finishes first."""
        start = time.monotonic()
        slot = await self._take(self._idle, "slot")  # waits while every worker is busy
        return await self._run_in_slot(slot, request, limits, payload, start)

    async def _run_in_slot(
        self, slot: int, request: dict, limits: Limits, payload: dict | None, start: float
    ) -> Result:
        pending: Future | None = None  # the blocking step in flight on the pool's threads
        on_channel: Worker | None = None  # the worker holding our request while it runs
        abandoned: Worker | None = None

        def blocking(fn: Callable, *args: object) -> asyncio.Future:
            nonlocal pending
            pending = self.executor.submit(fn, *args)
            return asyncio.wrap_future(pending)

        try:
            errors: list[str] = []
            for attempt in (1, 2):
                if self._closed:
                    return Result.infra(f"{self.provider} pool is closed", self.provider, attempt)
                worker, oom_before = None, None
                try:
                    worker = self._workers.get(slot)
                    if worker is None or not worker.usable:
                        worker = None
                        worker = await blocking(self._worker, slot)
                    if worker.cgroup is not None:
                        oom_before = worker.cgroup.oom_kills()
                        memory_mb = limits.memory_mb + limits.cgroup_headroom_mb
                        if worker.cgroup.memory_mb_differs(memory_mb):
                            await blocking(worker.cgroup.set_memory_mb, memory_mb)
                    on_channel = worker
                    if worker.async_io:
                        reply = await worker.request_async(request, limits.wall_s, payload)
                    else:
                        reply = await blocking(worker.request, request, limits.wall_s, payload)
                    on_channel = None
                except (WorkerDied, OSError) as exc:
                    on_channel = None
                    result = self._failed(
                        exc, attempt, start, errors, await blocking(self._drop, slot, worker, oom_before)
                    )
                else:
                    result, retire = self._outcome(worker, reply, oom_before, attempt, errors)
                    if retire:
                        await blocking(self._drop, slot, worker, None)
                if result is not None:
                    return result
            return Result.infra("; ".join(errors), self.provider, 2, (time.monotonic() - start) * 1000)
        except asyncio.CancelledError:
            abandoned = on_channel
            raise
        finally:
            if abandoned is not None:  # the caller gave up mid-execution: kill it, the slot gets a fresh worker
                if self._workers.get(slot) is abandoned:
                    self._workers[slot] = None
                self.retire(abandoned)
            if pending is not None and not pending.done():
                # a blocking step is in flight (a spawn, a kill, a request on a thread, which the retire above
                # ends): the slot is free once it is over, so no two workers are ever started for one slot
                pending.add_done_callback(lambda _: self._idle.put(slot))
            else:
                self._idle.put(slot)

    def _failed(self, exc: BaseException, attempt: int, start: float, errors: list[str], oom: bool) -> Result | None:
        """After a transport failure (the worker is already dropped): the OOM result, or None to retry."""
        errors.append(f"{type(exc).__name__}: {exc}")
        if oom:
            wall_ms = (time.monotonic() - start) * 1000
            return Result(
                status="oom",
                stderr="[sandbox] the jail ran out of memory",
                provider=self.provider,
                attempts=attempt,
                wall_ms=wall_ms,
            )
        self.stats["retries" if attempt == 1 else "infra_errors"] += 1
        return None

    def _outcome(
        self, worker: Worker, reply: dict, oom_before: int | None, attempt: int, errors: list[str]
    ) -> tuple[Result | None, bool]:
        """(the call's Result, or None to retry; whether to retire the worker now)."""
        if reply.get("status") == "infra_error":  # the worker noticed its own failure
            errors.append(reply.get("note", "worker reported an infrastructure error"))
            self.stats["retries" if attempt == 1 else "infra_errors"] += 1
            return None, True
        self.stats["executions"] += 1
        result = Result.from_wire(reply, self.provider, attempt)
        if oom_before is not None and result.status in ("killed", "error") and worker.cgroup.oom_kills() > oom_before:
            result.status = "oom"
        return result, worker.executions >= self.recycle_after or not worker.usable

    def _worker(self, slot: int) -> Worker:
        worker = self._workers.get(slot)
        if worker is None or not worker.usable:
            if worker is not None:
                self._drop(slot, worker, None)
            worker = self._factory(slot, False)
            self._workers[slot] = worker
            self.stats["respawns"] += 1
        return worker

    def _drop(self, slot: int, worker: Worker | None, oom_before: int | None) -> bool:
        """Retire a worker. True when its death was the memory cgroup's OOM killer (the snippet's doing)."""
        worker = worker or self._workers.get(slot)
        self._workers[slot] = None
        if worker is None:
            return False
        oom = worker.cgroup is not None and oom_before is not None and worker.cgroup.oom_kills() > oom_before
        worker.close()
        return oom

    # ---- dedicated workers for persistent sessions ------------------------------------------
    def dedicated(self, timeout_s: float | None = None) -> tuple[int, Worker] | None:
        """A session slot and a fresh dedicated worker for it, blocking: queues (FIFO) while every session slot
        is taken, never failing for capacity; None if `timeout_s` passes first (a caller that polls, so that no
        thread blocks for long). Give both back with `release`."""
        slot = self._take_blocking(self._session_slots, "session", timeout_s)
        if slot is None:
            return None
        try:
            return slot, self._factory(slot, True)
        except BaseException:
            self._session_slots.put(slot)
            raise

    async def dedicated_async(self) -> tuple[int, Worker]:
        """`dedicated` from an event loop. Cancelled while queued, the caller leaves the queue; cancelled while
        its worker starts, that worker is closed and the slot given back once the start is over."""
        slot = await self._take(self._session_slots, "session")
        try:
            return slot, await self.spawn_owned(slot, lambda: self._session_slots.put(slot))
        except asyncio.CancelledError:  # the slot goes back once the start is over
            raise
        except BaseException:
            self._session_slots.put(slot)
            raise

    async def spawn_owned(self, slot: int, orphaned: Callable[[], None] | None = None) -> Worker:
        """Start a dedicated worker for `slot` on the pool's threads. If the caller is cancelled meanwhile, the
        worker (once started) is closed, then `orphaned` runs: nothing started for a cancelled caller lives on.

        Raises:
            asyncio.CancelledError: when cancelled (`orphaned` runs later, once the start is over).
        """
        future = self.executor.submit(self._factory, slot, True)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:

            def close_orphan(done: Future) -> None:
                try:
                    if not done.cancelled() and done.exception() is None:
                        done.result().close()
                finally:
                    if orphaned is not None:
                        orphaned()

            future.add_done_callback(close_orphan)
            raise

    def release(self, slot: int, worker: Worker | None) -> None:
        """Close a session's worker (None: it has none now) and give its slot to the next session in line."""
        try:
            if worker is not None:
                worker.close()
        finally:
            self._session_slots.put(slot)

    @property
    def session_waiters(self) -> int:
        """Persistent sessions queued for a slot right now."""
        return self._session_slots.waiting

    @property
    def sessions_in_use(self) -> int:
        """Persistent sessions holding a slot right now (at most `max_sessions`)."""
        return self.max_sessions - self._session_slots.idle

    def warm(self, count: int | None = None) -> None:
        """Start up to `count` workers now instead of on first use."""
        slots = [self._idle.get() for _ in range(min(count or self.size, self.size))]
        try:
            for slot in slots:
                self._worker(slot)
        finally:
            for slot in slots:
                self._idle.put(slot)

    def close(self) -> None:
        """Stop every worker of the pool (and wait for abandoned ones still being killed)."""
        self._closed = True
        with self._lock:
            for slot in list(self._workers):
                worker = self._workers.pop(slot)
                if worker is not None:
                    worker.close()
            dying = list(self._dying.values())
        for done in dying:
            with contextlib.suppress(TimeoutError):
                done.result(timeout=30)
        self.executor.shutdown(wait=False, cancel_futures=True)


class PoolBackend:
    """The async face of a WorkerPool (the `Backend` protocol of sandboxes.api)."""

    def __init__(self, pool: WorkerPool) -> None:
        self.pool = pool
        self.name = pool.provider

    async def run(self, header: dict, payload: dict, limits: Limits) -> Result:
        return await self.pool.run_async(header, limits, payload)

    async def open_session(self) -> PoolSession:
        """A persistent session on a dedicated worker; queues while the pool's sessions are all open."""
        slot, worker = await self.pool.dedicated_async()
        return PoolSession(self.pool, slot, worker)

    def close(self) -> None:
        self.pool.close()


class PoolSession:
    """A dedicated worker for one persistent session. A worker failure loses the session's state;
    the call reports infra_error and the next call starts a fresh worker. A call whose caller is
    cancelled kills the worker at once (the state is lost; the next call starts a fresh one).

    Served on the event loop (`call`, `close`) or, in a Ray actor, from threads (`call_blocking`,
    `close_blocking`); one session uses one of the two."""

    def __init__(self, pool: WorkerPool, slot: int, worker: Worker) -> None:
        self.pool = pool
        self.slot = slot
        self.worker: Worker | None = worker
        self._async_io = worker.async_io
        self._lock = threading.Lock()  # one request at a time on the channel (threads)
        self._async_lock: asyncio.Lock | None = None  # the same on the event loop
        self._closed = False
        self._dying: list[Future] = []  # this session's abandoned workers being killed

    def _lost(self, exc: BaseException) -> Result:
        return Result.infra(f"{exc}; the session's state was lost", self.pool.provider, 1)

    def call_blocking(self, header: dict, payload: dict | None, limits: Limits) -> Result | dict:
        """One request, served on the calling thread (a Ray actor's)."""
        with self._lock:
            if self._closed:
                return Result.infra("the session is closed", self.pool.provider, 1)
            try:
                if self.worker is None:
                    self.worker = self.pool._factory(self.slot, True)
                reply = self.worker.request(header, limits.wall_s, payload)
            except (WorkerDied, OSError) as exc:
                if self.worker is not None:
                    self.worker.close()
                self.worker = None
                return self._lost(exc)
        if "status" in reply:
            return Result.from_wire(reply, self.pool.provider)
        return reply

    async def call(self, header: dict, payload: dict | None, limits: Limits) -> Result | dict:
        """One request (a REPL cell, an exec, a file transfer). Cancelled mid-request, the worker is killed."""
        if not self._async_io:
            return await self._call_on_thread(header, payload, limits)
        if self._async_lock is None:
            self._async_lock = asyncio.Lock()
        async with self._async_lock:
            if self._closed:
                return Result.infra("the session is closed", self.pool.provider, 1)
            worker = self.worker
            try:
                if worker is None:
                    worker = await self.pool.spawn_owned(self.slot)
                    if self._closed:  # closed while it started: not ours to keep
                        await asyncio.get_running_loop().run_in_executor(None, worker.close)
                        return Result.infra("the session is closed", self.pool.provider, 1)
                    self.worker = worker
                reply = await worker.request_async(header, limits.wall_s, payload)
            except (WorkerDied, OSError) as exc:
                if worker is not None:
                    if self.worker is worker:
                        self.worker = None
                    await asyncio.get_running_loop().run_in_executor(None, worker.close)
                return self._lost(exc)
            except asyncio.CancelledError:
                if worker is not None and self.worker is worker:  # abandoned on the channel: kill it now
                    self.worker = None
                    self._dying.append(self.pool.retire(worker))
                raise
        if "status" in reply:
            return Result.from_wire(reply, self.pool.provider)
        return reply

    async def _call_on_thread(self, header: dict, payload: dict | None, limits: Limits) -> Result | dict:
        """A worker whose channel blocks (docker): the request runs on a pool thread; cancelled, the worker is
        killed, which ends the request on that thread at once."""
        future = self.pool.executor.submit(self.call_blocking, header, payload, limits)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            worker = self.worker
            if worker is not None and not future.done():
                self.pool.stats["abandoned"] += 1
                threading.Thread(target=worker.kill, daemon=True).start()
            raise

    def close_blocking(self) -> None:
        """End the session from a thread: its worker closed, its slot given to the next session in line."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            worker, self.worker = self.worker, None
        self._await_dying(list(self._dying))
        self.pool.release(self.slot, worker)

    @staticmethod
    def _await_dying(dying: list[Future]) -> None:
        for done in dying:
            with contextlib.suppress(TimeoutError):
                done.result(timeout=30)

    async def close(self) -> None:
        """End the session: its worker closed (any abandoned one gone), its slot given to the next in line. Runs
        to the end on a thread even if the caller is cancelled meanwhile."""
        if self._async_io:
            if self._closed:
                return
            self._closed = True  # a call starting a worker meanwhile closes it itself
            worker, self.worker = self.worker, None
            dying = list(self._dying)

            def finish() -> None:
                self._await_dying(dying)
                self.pool.release(self.slot, worker)

            await asyncio.get_running_loop().run_in_executor(None, finish)
        else:
            await asyncio.get_running_loop().run_in_executor(None, self.close_blocking)
