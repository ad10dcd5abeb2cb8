"""The server's page cache: the rendered answers of its read-mostly GET routes (the PEP 503 index, ``/api/resolve``,
the hub's package page, env pages and their diffs, an uploaded eval's episode pages), replayed without running the
route while the registry database has not changed.

- **Always current, across workers and replicas.** Every write that changes what is shown advances a change stamp in
  the database, in its own transaction (``env_registry.store.database``: ``content`` for publish, yank, validation
  verdicts and eval summaries; ``downloads`` for install counts). Each request reads the stamps (one primary-key
  row) before anything else, and an entry is replayed only under the stamps it was rendered at; so once a write's
  response has reached its client, no worker or replica of any process on that database serves the page from
  before it. On PostgreSQL the read goes over one asynchronous connection per process, and requests that arrive
  while a read is in flight share the next one (which starts after they arrived: still current for each).
- **Keyed on who asks.** The key holds the path, query, host, scheme and root path, and the principal the auth rule
  establishes (``env_registry.hub.access.principal``: the hub session's publisher, or on a private server the token's):
  one reader's page is never replayed to another. A request the auth rule refuses, or whose stamp read fails, goes
  to the route uncached.
- **Visible.** A replayed answer carries ``X-Cache: hit``, one the route rendered ``X-Cache: miss``.
- **Bounded.** Only 200 answers without ``Set-Cookie``, at most ``MAX_ENTRY_BYTES`` each and ``MAX_TOTAL_BYTES`` in
  all (least recently used first out), are kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections import OrderedDict
from typing import Any

from fastapi.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from env_registry.errors import Error
from env_registry.hub.access import SESSION_COOKIE, principal
from env_registry.store.local import LocalRegistry

STAMP_SQL = "SELECT content, downloads FROM changes WHERE id = 1"
# path prefix -> which stamps its answers depend on (0: content, 1: downloads); ReleaseInfo, the package page and the
# env page carry install counts, the index does not
CACHED = {"/simple/": (0,), "/p/": (0,), "/api/resolve": (0, 1), "/packages/": (0, 1), "/envs/": (0, 1)}
CACHED["/evals/"] = (0,)  # an uploaded eval's episodes (immutable once stored; a 404 before that is not kept)
MAX_ENTRY_BYTES = 1 << 20
MAX_TOTAL_BYTES = 64 << 20
STAMP_TIMEOUT_S = 10.0  # a stamp read (connecting included) that takes longer leaves its requests uncached


class Stamps:
    """Reads the registry's change stamps ``(content, downloads)``; None when the database cannot be read now.

    Args:
        registry: the registry whose database is read.
    """

    def __init__(self, registry: LocalRegistry) -> None:
        self.registry = registry
        self.sqlite = registry.url.get_backend_name() == "sqlite"
        self._db: Any = None  # sqlite3.Connection, or psycopg.AsyncConnection on its event loop
        self._loop: asyncio.AbstractEventLoop | None = None
        self._next: asyncio.Future[tuple[int, int] | None] | None = None  # the read that starts after the running one
        self._reading = False

    async def read(self) -> tuple[int, int] | None:
        """The stamps as of a read that began after this call did."""
        if self.sqlite:
            return self._read_sqlite()
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # a connection belongs to the event loop that opened it
            self._db, self._loop, self._next, self._reading = None, loop, None, False
        if self._next is None:
            self._next = loop.create_future()
        waiting = self._next
        if not self._reading:
            self._reading = True
            loop.create_task(self._read_postgresql())
        return await asyncio.shield(waiting)  # a cancelled request must not cancel the others' read

    def _read_sqlite(self) -> tuple[int, int] | None:
        try:
            if self._db is None:  # in autocommit mode each SELECT reads the newest committed state
                self._db = sqlite3.connect(self.registry.url.database, isolation_level=None, check_same_thread=False)
            return self._db.execute(STAMP_SQL).fetchone()
        except sqlite3.Error:
            self._db = None
            return None

    async def _read_postgresql(self) -> None:
        try:
            while self._next is not None:
                waiting, self._next = self._next, None
                try:
                    waiting.set_result(await asyncio.wait_for(self._query_postgresql(), STAMP_TIMEOUT_S))
                except Exception:  # any failure: those waiting go uncached, the next read reconnects
                    broken, self._db = self._db, None
                    waiting.set_result(None)
                    if broken is not None:
                        with contextlib.suppress(Exception):
                            await broken.close()
        finally:
            self._reading = False

    async def _query_postgresql(self) -> tuple[int, int]:
        import psycopg  # only a PostgreSQL registry needs it

        if self._db is None:
            conninfo = self.registry.url.set(drivername="postgresql").render_as_string(hide_password=False)
            self._db = await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
        cursor = await self._db.execute(STAMP_SQL)
        return await cursor.fetchone()


class PageCache:
    """ASGI middleware replaying the cached answers of the routes under ``CACHED`` (see the module docstring).

    Args:
        app: the application it wraps.
        registry: the registry the app serves.
        private: the server is private (reading needs a token or a hub session).
    """

    def __init__(self, app: ASGIApp, registry: LocalRegistry, private: bool) -> None:
        self.app = app
        self.registry = registry
        self.private = private
        self.stamps = Stamps(registry)
        self.entries: OrderedDict[tuple[Any, ...], tuple[tuple[int, ...], list[Message]]] = OrderedDict()
        self.size = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        depends = _depends(scope)
        if depends is None:
            return await self.app(scope, receive, send)
        request = Request(scope)
        credentials = "authorization" in request.headers or SESSION_COOKIE in request.cookies
        # a credential is checked in the database: off the event loop
        try:
            who = await run_in_threadpool(principal, request, self.private) if credentials else None
        except Error:  # refused: the route answers why
            return await self.app(scope, receive, send)
        if who is None and self.private:
            return await self.app(scope, receive, send)
        stamps = await self.stamps.read()
        if stamps is None:
            return await self.app(scope, receive, send)
        stamp = tuple(stamps[i] for i in depends)
        key = (scope["path"], scope["query_string"], request.headers.get("host"), scope["scheme"])
        key += (scope.get("root_path", ""), who)
        entry = self.entries.get(key)
        if entry is not None and entry[0] == stamp:
            self.entries.move_to_end(key)
            for message in entry[1]:
                await send(message)
            return
        sent: list[Message] = []

        async def capture(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), (b"x-cache", b"miss")]}
            sent.append(message)
            await send(message)

        await self.app(scope, receive, capture)
        self._keep(key, stamp, sent)

    def _keep(self, key: tuple[Any, ...], stamp: tuple[int, ...], sent: list[Message]) -> None:
        if not sent or sent[0]["type"] != "http.response.start" or sent[0]["status"] != 200:
            return
        if any(name.lower() == b"set-cookie" for name, _ in sent[0].get("headers", [])):
            return
        size = sum(len(m.get("body", b"")) for m in sent)
        if size > MAX_ENTRY_BYTES or any(m["type"] != "http.response.body" for m in sent[1:]):
            return
        old = self.entries.pop(key, None)
        if old is not None:
            self.size -= _size(old[1])
        headers = [(n, b"hit" if n == b"x-cache" else v) for n, v in sent[0]["headers"]]
        self.entries[key] = (stamp, [{**sent[0], "headers": headers}, *sent[1:]])
        self.size += size
        while self.size > MAX_TOTAL_BYTES:
            _, (_, dropped) = self.entries.popitem(last=False)
            self.size -= _size(dropped)


def _depends(scope: Scope) -> tuple[int, ...] | None:
    """Which stamps the answer to a request depends on; None for a request that is not cached."""
    if scope["type"] != "http" or scope["method"] != "GET":
        return None
    path = scope["path"]
    return next((stamps for prefix, stamps in CACHED.items() if path.startswith(prefix)), None)


def _size(sent: list[Message]) -> int:
    return sum(len(m.get("body", b"")) for m in sent)
