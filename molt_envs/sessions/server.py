"""The OpenAI/Anthropic-compatible session server (FastAPI + uvicorn) in front of any ``Engine``.

Routes:

- ``POST /s/{session_id}/v1/chat/completions``: OpenAI Chat Completions (``AsyncOpenAI(base_url=.../s/<sid>/v1)``).
- ``POST /s/{session_id}/v1/responses``: the OpenAI Responses API (Codex, the Agents SDK's default model);
  ``GET /s/{session_id}/v1/responses/{id}`` reads a stored response back.
- ``POST /s/{session_id}/v1/messages``: the Anthropic wire (``AsyncAnthropic(base_url=.../s/<sid>)``, Claude Code);
  ``POST /s/{session_id}/v1/messages/count_tokens`` counts a request's prompt with the chat template.
  All three answer JSON or, with ``"stream": true``, server-sent events in their own wire's format, and all three
  capture the same way (one ``Session``: same segments, same compaction rule, same retry replay).
- ``GET /s/{session_id}/v1/models`` (and ``/v1/models/{id}``): the served model, in a body both SDKs parse; any
  model name a request carries is served by it.
- ``POST /sessions`` → ``{"session_id", "base_url", "session_url"}``; ``GET /sessions/{id}/trajectory`` → the
  token-exact segments; ``DELETE /sessions/{id}``: what external harnesses and evaluators use.
- ``POST /judge/v1/chat/completions``: OpenAI Chat Completions outside any session, for LLM-as-judge calls
  (``molt_envs.judge.JudgeClient``): each call is rendered and generated on its own and recorded nowhere, so a
  judge served by the policy's own engine never lands in a rollout's captured tokens.
- ``GET /health``.

``unix_socket()`` also serves the ``/s/{session_id}/...`` routes (and nothing else) on a unix socket, which a
sandboxed harness reaches through a read-only bind of its directory (see ``molt_envs.harness``). There a request
reaches a session only with that session's ``api_key`` (as ``Authorization: Bearer`` or ``x-api-key``, which is how
both SDKs and every harness send the key they are given): a jail that knows another session's id still cannot use
it. On TCP keys are not checked (``molt-train serve`` is for the operator's own clients).

Bad requests (unknown session, malformed JSON, wrong types, empty messages, oversized bodies) get a 4xx whose body
says what was wrong; only an engine or server fault is a 5xx. Each chat response carries a ``Server-Timing`` header:
``handler`` (ms from the request body's arrival to the response being ready) and ``engine`` (ms inside
``Engine.generate``), so the server's own overhead per call can be measured.

``SessionServer.start()`` serves on the *running* event loop (uvicorn, no signal handlers), which is how
``ChatAgentRunner`` embeds it; ``molt-train serve`` runs it standalone.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from molt_envs.contract import SamplingParams
from molt_envs.engine import Engine
from molt_envs.runners import INLINE_MAX_CHARS, off_loop
from molt_envs.sessions import wire_anthropic, wire_openai, wire_responses
from molt_envs.sessions.request_fields import session_params
from molt_envs.sessions.session import BadRequest, ChatTemplate, Session, SessionClosed, segment_json

MAX_BODY_BYTES = 8 * 1024 * 1024


class _Problem(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class SessionServer:
    """Serves every session's OpenAI (Chat Completions, Responses) and Anthropic routes in front of one engine.

    A client gets ``/s/{session_id}/v1`` as its base URL (``urls``); every call it makes there is one turn of that
    session, captured token-exactly into ``Session.segments``. ``POST /sessions``, ``GET /sessions/{id}/trajectory``
    and ``DELETE /sessions/{id}`` open, read and close sessions over HTTP; ``open_session``/``close_session`` do it in
    process.

    Args:
        engine: generates with token ids and log-probs (``molt_envs.engine.Engine``).
        tokenizer: a tokenizer with a ``chat_template`` that renders assistant content verbatim.
        host, port: where ``start`` listens (port 0: a free one).
        model_name: the model name replies and ``/v1/models`` carry (requests may name any model).
        params: default sampling parameters of new sessions.
        max_length: default token budget of a session's conversation (capped by the engine's ``max_positions``).
        max_body_bytes: a larger request body is a 413.
        max_sessions: a session opened past this many open ones is a 429.
        session_ttl_s: seconds an unused session is kept; None keeps sessions until closed.

    Raises:
        ValueError: if the tokenizer has no usable chat template.
    """

    def __init__(
        self,
        engine: Engine,
        tokenizer: Any,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        model_name: str = "policy",
        params: SamplingParams | None = None,
        max_length: int | None = None,
        max_body_bytes: int = MAX_BODY_BYTES,
        max_sessions: int = 100_000,
        session_ttl_s: float | None = None,
    ) -> None:
        self.engine = engine
        self.template = ChatTemplate(tokenizer)
        self.host, self.port = host, port
        self.model_name = model_name
        self.params = params or SamplingParams()
        self.max_length = max_length or getattr(engine, "max_positions", None) or 32768
        self.max_body_bytes = max_body_bytes
        self.max_sessions = max_sessions
        self.session_ttl_s = session_ttl_s  # None: sessions live until closed (ChatAgentRunner closes its own)
        self._swept = time.monotonic()
        self._created = time.time()
        self.sessions: dict[str, Session] = {}
        self.closed_replays = 0  # the replays of sessions closed so far (``replays``)
        self.app = self._build_app()
        self.url: str | None = None  # http://host:port once started
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task | None = None
        self._unix: tuple[str, uvicorn.Server, asyncio.Task] | None = None
        self._unix_lock = asyncio.Lock()  # concurrent first callers must share one socket

    # -- sessions --
    def open_session(
        self,
        *,
        params: SamplingParams | None = None,
        max_length: int | None = None,
        prompt: Any = None,
        label: Any = None,
    ) -> Session:
        """Open a session (first dropping idle ones past ``session_ttl_s``).

        Args:
            params: its sampling parameters (default: the server's).
            max_length: its conversation's token budget (default: the server's; capped by the model's positions).
            prompt, label: recorded on its segments.

        Returns:
            The new ``Session``; its routes are served under ``urls(session.session_id)``.

        Raises:
            _Problem: (HTTP 429) if ``max_sessions`` sessions are open.
        """
        self._expire_idle()
        if len(self.sessions) >= self.max_sessions:
            raise _Problem(
                429,
                f"{len(self.sessions)} sessions are open (limit {self.max_sessions}); "
                "DELETE /sessions/{id} the finished ones",
            )
        positions = getattr(self.engine, "max_positions", None)  # a context limit longer than the model's is moot
        max_length = min(max_length or self.max_length, positions or 1 << 62)
        session = Session(
            self.engine, self.template, params=params or self.params, max_length=max_length, prompt=prompt, label=label
        )
        self.sessions[session.session_id] = session
        return session

    def close_session(self, session_id: str) -> Session | None:
        """Close a session: its routes answer 404 from now on and a call in flight records nothing.

        Args:
            session_id: the session's id.

        Returns:
            The closed session (its ``segments`` are final), or None if no such session is open.
        """
        session = self.sessions.pop(session_id, None)
        if session is not None:
            session.closed = True
            self.closed_replays += session.replays
        return session

    @property
    def replays(self) -> int:
        """Retries answered by replay, over every session this server opened (a client whose connection broke
        mid-call sends the same request again and gets the answer it missed)."""
        return self.closed_replays + sum(s.replays for s in self.sessions.values())

    def _expire_idle(self) -> None:
        """Drop sessions idle for longer than ``session_ttl_s`` (checked at most every tenth of the TTL)."""
        now = time.monotonic()
        if self.session_ttl_s is None or now - self._swept < self.session_ttl_s / 10:
            return
        self._swept = now
        for session_id in [
            i for i, s in self.sessions.items() if now - s.last_used > self.session_ttl_s and not s.lock.locked()
        ]:  # none mid-call
            self.close_session(session_id)

    def urls(self, session_id: str, root: str | None = None) -> tuple[str, str]:
        """A session's URLs.

        Args:
            session_id: the session's id.
            root: the server root as the client reaches it (default: ``url``, set by ``start``).

        Returns:
            ``(base_url, session_url)``: the OpenAI client's base URL (``.../v1``) and the Anthropic client's.
        """
        session_url = f"{(root or self.url or '').rstrip('/')}/s/{session_id}"
        return f"{session_url}/v1", session_url

    # -- serving --
    async def start(self) -> str:
        """Serve on the running event loop (a second call returns at once).

        Returns:
            The root URL, ``http://host:port`` (the real port when ``port`` was 0).

        Raises:
            OSError: if ``host:port`` cannot be listened on (the message says to pick another).
            RuntimeError: if the HTTP server failed to start.
        """
        if self._task is not None:
            return self.url
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets that say TCP (else Nagle + delayed ACK add ~40 ms)
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self.port))
        except OSError as exc:
            sock.close()
            raise OSError(
                f"the session server cannot listen on {self.host}:{self.port}: {exc}; pick another "
                "--host/--port (port 0 picks a free one)"
            ) from exc
        sock.set_inheritable(True)
        port = sock.getsockname()[1]
        host = f"[{self.host}]" if family == socket.AF_INET6 else self.host
        self.url = f"http://{'127.0.0.1' if self.host == '0.0.0.0' else host}:{port}"
        config = uvicorn.Config(self.app, log_level="warning", lifespan="off", access_log=False, timeout_keep_alive=60)
        self._server = _InLoopServer(config)
        self._task = asyncio.get_running_loop().create_task(self._server.serve(sockets=[sock]))
        while not self._server.started:
            if self._task.done():
                raise RuntimeError(f"the session server failed to start: {self._task.exception()!r}")
            await asyncio.sleep(0.005)
        return self.url

    async def unix_socket(self) -> str:
        """A unix socket serving each session's routes to that session's key holder only, started on first use.

        The socket (mode 0666) sits in a directory of its own: a sandboxed client connects to it through a read-only
        bind of that directory. Only ``/s/{session_id}/...`` paths are served there, and only to a request that
        carries the session's ``api_key``; the ``/sessions`` routes (open, read, delete) are not served at all.

        Returns:
            The socket's path.

        Raises:
            RuntimeError: if its server could not start.
        """
        async with self._unix_lock:
            if self._unix is not None:
                return self._unix[0]
            directory = tempfile.mkdtemp(prefix="molt-session-")
            os.chmod(directory, 0o755)  # a jail's unprivileged uid must reach the socket
            path = os.path.join(directory, "session.sock")
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.bind(path)
            os.chmod(path, 0o666)
            config = uvicorn.Config(
                _KeyHoldersOnly(self.app, self.sessions),
                log_level="warning",
                lifespan="off",
                access_log=False,
                timeout_keep_alive=60,
            )
            server = _InLoopServer(config)
            task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
            while not server.started:
                if task.done():
                    shutil.rmtree(directory, ignore_errors=True)
                    raise RuntimeError(f"the session server's unix socket failed to start: {task.exception()!r}")
                await asyncio.sleep(0.005)
            self._unix = (path, server, task)
            return path

    async def stop(self) -> None:
        """Stop serving (TCP and the unix socket, whose directory is removed); open sessions are kept."""
        for server, task in [(self._server, self._task), self._unix[1:] if self._unix else (None, None)]:
            if server is not None and task is not None:
                server.should_exit = True
                with contextlib.suppress(Exception):
                    await task
        if self._unix is not None:
            shutil.rmtree(os.path.dirname(self._unix[0]), ignore_errors=True)
        self._server = self._task = self._unix = None

    # -- HTTP --
    def _build_app(self) -> FastAPI:
        app = FastAPI(title="molt session server", docs_url=None, redoc_url=None)

        @app.get("/health")
        async def health() -> dict[str, Any]:
            return {"status": "ok", "sessions": len(self.sessions), "model": self.model_name}

        # the hot routes are plain Starlette routes: no FastAPI parameter solving on every call
        def chat_route(wire: Any) -> Any:
            async def route(request: Request) -> Response:
                return await self._chat(request.path_params["session_id"], request, wire)

            return route

        app.add_route("/s/{session_id}/v1/chat/completions", chat_route(wire_openai), methods=["POST"])
        app.add_route("/s/{session_id}/v1/responses", chat_route(wire_responses), methods=["POST"])
        app.add_route("/s/{session_id}/v1/messages", chat_route(wire_anthropic), methods=["POST"])

        async def judge_route(request: Request) -> Response:
            return await self._chat(None, request, wire_openai)

        app.add_route("/judge/v1/chat/completions", judge_route, methods=["POST"])

        @app.get("/s/{session_id}/v1/responses/{response_id}")
        async def get_response(session_id: str, response_id: str) -> Response:
            session = self.sessions.get(session_id)
            if session is None:
                return JSONResponse(wire_openai.error(_unknown(session_id), 404), status_code=404)
            body = wire_responses.stored_response(session, response_id)
            if body is None:
                message = f"response {response_id!r} is not stored in this session (unknown, or sent with store: false)"
                return JSONResponse(wire_openai.error(message, 404), status_code=404)
            return JSONResponse(body)

        @app.post("/s/{session_id}/v1/messages/count_tokens")
        async def count_tokens(session_id: str, request: Request) -> Response:
            try:
                session = self.sessions.get(session_id)
                if session is None:
                    raise _Problem(404, _unknown(session_id))
                raw = await self._read(request)
                body = _json_object(raw)
                count = wire_anthropic.count_tokens
                return JSONResponse(
                    count(body, session) if len(raw) <= INLINE_MAX_CHARS else await off_loop(count, body, session)
                )
            except _Problem as exc:
                return JSONResponse(wire_anthropic.error(str(exc), exc.status), status_code=exc.status)
            except (BadRequest, RecursionError) as exc:
                message = str(exc) if isinstance(exc, BadRequest) else "the request nests deeper than the server parses"
                return JSONResponse(wire_anthropic.error(message, 400), status_code=400)

        @app.get("/v1/models")
        @app.get("/s/{session_id}/v1/models")
        async def models(session_id: str | None = None) -> Response:
            if session_id is not None and session_id not in self.sessions:
                return JSONResponse(wire_openai.error(_unknown(session_id), 404), status_code=404)
            card = self._model_card()
            return JSONResponse(
                {"object": "list", "data": [card], "has_more": False, "first_id": card["id"], "last_id": card["id"]}
            )

        @app.get("/v1/models/{model_id:path}")
        @app.get("/s/{session_id}/v1/models/{model_id:path}")
        async def model(model_id: str, session_id: str | None = None) -> Response:
            if session_id is not None and session_id not in self.sessions:
                return JSONResponse(wire_openai.error(_unknown(session_id), 404), status_code=404)
            return JSONResponse(self._model_card())  # any name is served by the one model, as requests are

        @app.post("/sessions")
        async def create_session(request: Request) -> Response:
            try:
                raw = await self._read(request)
                body = _json_object(raw) if raw.strip() else {}
                params = self.params
                if body.get("sampling_params") is not None:
                    params = session_params(body["sampling_params"], self.params)
                max_length = body.get("max_length")
                if max_length is not None and (
                    not isinstance(max_length, int) or isinstance(max_length, bool) or max_length < 1
                ):
                    raise BadRequest(f"max_length must be a positive integer, got {json.dumps(max_length)[:80]}")
                session = self.open_session(params=params, max_length=max_length)
            except BadRequest as exc:
                return JSONResponse(wire_openai.error(str(exc), 400), status_code=400)
            except _Problem as exc:
                return JSONResponse(wire_openai.error(str(exc), exc.status), status_code=exc.status)
            base_url, session_url = self.urls(session.session_id, str(request.base_url))
            return JSONResponse({"session_id": session.session_id, "base_url": base_url, "session_url": session_url})

        @app.get("/sessions/{session_id}/trajectory")
        async def trajectory(session_id: str) -> Response:
            session = self.sessions.get(session_id)
            if session is None:
                return JSONResponse(wire_openai.error(_unknown(session_id), 404), status_code=404)
            async with session.lock:  # a consistent snapshot, never half a turn
                segments = [segment_json(s) for s in session.segments]
            return JSONResponse({"session_id": session_id, "rollout_id": session.rollout_id, "segments": segments})

        @app.delete("/sessions/{session_id}")
        async def delete_session(session_id: str) -> Response:
            if self.close_session(session_id) is None:
                return JSONResponse(wire_openai.error(_unknown(session_id), 404), status_code=404)
            return JSONResponse({"session_id": session_id, "deleted": True})

        return app

    def _model_card(self) -> dict[str, Any]:
        """The served model in the shape of both SDKs' model objects (OpenAI's and Anthropic's fields side by side)."""
        created = int(self._created)
        return {
            "id": self.model_name,
            "object": "model",
            "created": created,
            "owned_by": "molt",
            "type": "model",
            "display_name": self.model_name,
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(created)),
        }

    async def _chat(self, session_id: str | None, request: Request, wire: Any) -> Response:
        """One chat call on ``wire`` (a module with ``decode``, ``encode``, ``encode_stream`` and ``error``);
        ``session_id`` None: a judge call, in a session of its own that no one keeps."""
        try:
            if session_id is None:
                session = Session(self.engine, self.template, params=self.params, max_length=self.max_length)
            else:
                session = self.sessions.get(session_id)
            if session is None:
                raise _Problem(404, _unknown(session_id))
            raw = await self._read(request)
            started = time.perf_counter()  # the server's own time starts once the client has sent the body
            call = wire.decode(_json_object(raw), session)
            replies = await session.turn_choices(call.request)
            reply = replies[0]
            if len(replies) > 1:
                call.options["choices"] = replies
        except _Problem as exc:
            return JSONResponse(wire.error(str(exc), exc.status), status_code=exc.status)
        except BadRequest as exc:
            return JSONResponse(wire.error(str(exc), 400), status_code=400)
        except SessionClosed as exc:
            return JSONResponse(wire.error(str(exc), 404), status_code=404)
        except RecursionError:
            return JSONResponse(
                wire.error("the request nests deeper than the server parses; flatten it", 400), status_code=400
            )
        except Exception as exc:  # the engine or the server failed, not the request
            return JSONResponse(wire.error(f"generation failed: {type(exc).__name__}: {exc}", 500), status_code=500)
        if call.stream:
            response: Response = StreamingResponse(
                wire.encode_stream(reply, self.model_name, call, session),
                media_type="text/event-stream",
                headers={"cache-control": "no-cache"},
            )
        else:
            response = JSONResponse(wire.encode(reply, self.model_name, call, session))
        response.headers["server-timing"] = (
            f"handler;dur={(time.perf_counter() - started) * 1000:.3f}, engine;dur={reply.engine_s * 1000:.3f}"
        )
        return response

    async def _read(self, request: Request) -> bytes:
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > self.max_body_bytes:
            raise _Problem(413, f"request body is {declared} bytes; the limit is {self.max_body_bytes}")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.max_body_bytes:
                raise _Problem(413, f"request body exceeds the {self.max_body_bytes}-byte limit")
            chunks.append(chunk)
        return b"".join(chunks)


class _InLoopServer(uvicorn.Server):
    """uvicorn on someone else's event loop: it must not take over the process's signal handlers."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class _KeyHoldersOnly:
    """ASGI wrapper of the unix socket: only ``/s/{session_id}/...`` paths, and only with that session's key.

    Anything else is a 403 that names what was missing (never whether another session exists).
    """

    def __init__(self, app: Any, sessions: dict[str, Session]) -> None:
        self.app = app
        self.sessions = sessions

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            problem = self._refusal(scope)
            if problem is not None:
                await JSONResponse(wire_openai.error(problem, 403), status_code=403)(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _refusal(self, scope: dict) -> str | None:
        path = scope["path"]
        if not path.startswith("/s/"):
            return f"{path} is not served on this socket: it serves only /s/<session_id>/... routes"
        session = self.sessions.get(path[3:].split("/", 1)[0])
        headers = dict(scope["headers"])
        offered = headers.get(b"x-api-key") or headers.get(b"authorization", b"").removeprefix(b"Bearer ")
        if session is None or not hmac.compare_digest(offered, session.api_key.encode()):
            return (
                f"{path} is refused: on this socket a session serves only requests that carry its api key "
                "(ChatContext.api_key, sent as Authorization: Bearer or x-api-key)"
            )
        return None


def _unknown(session_id: str) -> str:
    return f"unknown session {session_id!r}; open one with POST /sessions (or through ChatAgentRunner)"


def _json_object(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise BadRequest(f"the request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise BadRequest("the request body nests deeper than the server parses; flatten it") from None
    if not isinstance(body, dict):
        raise BadRequest(f"the request body must be a JSON object, got {type(body).__name__}")
    return body
