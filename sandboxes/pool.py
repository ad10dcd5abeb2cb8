"""A fixed-size pool of warm workers shared by many sandbox sessions.

`run_async` serves one-shot executions from an event loop (any loop: a thread without one runs it
under `asyncio.run`), keeping blocking steps (spawning and killing workers, cgroup writes) on the
pool's threads. Callers queue when every worker is busy (back-pressure). Workers start lazily, are
recycled after `recycle_after` executions or when they report an unhealthy sweep, and are replaced
after any transport failure; such a failure is retried once on a fresh worker and otherwise
reported as "infra_error".
"""

from __future__ import annotations

import asyncio
import queue
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

    def get(self) -> int:
        with self._lock:
            if self._idle:
                return self._idle.popleft()
            waiter: Future = Future()
            self._waiters.append((None, waiter))
        return waiter.result()

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
        self._session_slots = queue.Queue()
        for slot in range(size, size + max_sessions):
            self._session_slots.put(slot)
        self._lock = threading.Lock()
        self._closed = False
        self.executor = ThreadPoolExecutor(
            max_workers=size + max_sessions + 4, thread_name_prefix=f"sandboxes-{provider}"
        )
        self.stats = {"executions": 0, "infra_errors": 0, "retries": 0, "respawns": 0}

    # ---- one-shot executions -------------------------------------------------------------
    async def run_async(self, request: dict, limits: Limits, payload: dict | None = None) -> Result:
        """One execution served from the event loop: the request and reply travel on the loop
        (workers with `async_io`), only blocking steps (spawn, kill, cgroup writes) go to threads.
        Cancelling the caller does not cut the execution short (as with a thread): it finishes in
        the background and frees its worker."""
        start = time.monotonic()
        slot = await self._idle.get_async()  # waits while every worker is busy
        task = asyncio.get_running_loop().create_task(self._run_in_slot(slot, request, limits, payload, start))
        return await asyncio.shield(task)

    async def _run_in_slot(
        self, slot: int, request: dict, limits: Limits, payload: dict | None, start: float
    ) -> Result:
        pending: Future | None = None  # the blocking step in flight on the pool's threads

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
                    if worker.async_io:
                        reply = await worker.request_async(request, limits.wall_s, payload)
                    else:
                        reply = await blocking(worker.request, request, limits.wall_s, payload)
                except (WorkerDied, OSError) as exc:
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
        finally:
            if (
                pending is not None and not pending.done()
            ):  # cancelled (the loop is closing): free the slot after the step
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
    def dedicated(self) -> tuple[int, Worker]:
        try:
            slot = self._session_slots.get(timeout=60)
        except queue.Empty:
            raise RuntimeError(f"all persistent {self.provider} sessions are in use; close some first") from None
        try:
            return slot, self._factory(slot, True)
        except BaseException:
            self._session_slots.put(slot)
            raise

    def release(self, slot: int, worker: Worker) -> None:
        worker.close()
        self._session_slots.put(slot)

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
        self._closed = True
        with self._lock:
            for slot in list(self._workers):
                worker = self._workers.pop(slot)
                if worker is not None:
                    worker.close()
        self.executor.shutdown(wait=False, cancel_futures=True)


class PoolBackend:
    """The async face of a WorkerPool (the `Backend` protocol of sandboxes.api)."""

    def __init__(self, pool: WorkerPool) -> None:
        self.pool = pool
        self.name = pool.provider

    async def run(self, header: dict, payload: dict, limits: Limits) -> Result:
        return await self.pool.run_async(header, limits, payload)

    async def open_session(self) -> PoolSession:
        loop = asyncio.get_running_loop()
        slot, worker = await loop.run_in_executor(self.pool.executor, self.pool.dedicated)
        return PoolSession(self.pool, slot, worker)

    def close(self) -> None:
        self.pool.close()


class PoolSession:
    """A dedicated worker for one persistent session. A worker failure loses the session's state;
    the call reports infra_error and the next call starts a fresh worker."""

    def __init__(self, pool: WorkerPool, slot: int, worker: Worker) -> None:
        self.pool = pool
        self.slot = slot
        self.worker: Worker | None = worker
        self._lock = threading.Lock()  # one request at a time on the channel

    def _call(self, header: dict, payload: dict | None, limits: Limits) -> Result | dict:
        with self._lock:
            try:
                if self.worker is None:
                    self.worker = self.pool._factory(self.slot, True)
                reply = self.worker.request(header, limits.wall_s, payload)
            except (WorkerDied, OSError) as exc:
                if self.worker is not None:
                    self.worker.close()
                self.worker = None
                return Result.infra(f"{exc}; the session's state was lost", self.pool.provider, 1)
        if "status" in reply:
            return Result.from_wire(reply, self.pool.provider)
        return reply

    async def call(self, header: dict, payload: dict | None, limits: Limits) -> Result | dict:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.pool.executor, self._call, header, payload, limits)

    async def close(self) -> None:
        worker, self.worker = self.worker, None
        if worker is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.pool.release, self.slot, worker)
        else:
            self.pool._session_slots.put(self.slot)
