"""A recording pass-through in front of a model endpoint, for ``ChatAgent``s evaluated against it.

A ChatAgent makes its own SDK calls, so the eval sees neither its conversation nor its token counts. Each sample
gets a route prefix on this loopback proxy (``/r/<id>/openai`` for the OpenAI SDK's ``base_url``, ``/r/<id>/anthropic``
for the Anthropic SDK's): requests are forwarded unchanged to that sample's upstream (a ``molt-train serve``
session, or the endpoint itself), and each chat call (request messages and the JSON reply) is recorded for the
sample's transcript, its token counts and ``--reverify``. A missing ``seed`` is filled in on the OpenAI wire, so a
sample is as reproducible as the endpoint allows. Streamed replies pass through as they come; a streamed Chat
Completions reply is recorded reassembled from its chunks, other streamed calls without their reply.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route as HTTPRoute

HOP_HEADERS = {"host", "content-length", "connection", "transfer-encoding", "keep-alive", "accept-encoding"}


@dataclass
class Route:
    openai_base: str  # what the OpenAI SDK would be given (ends in /v1 for most servers)
    anthropic_root: str  # what the Anthropic SDK would be given (it appends /v1/messages)
    seed: int | None = None
    calls: list[dict[str, Any]] = field(default_factory=list)


class RecordingProxy:
    """Serve on the running loop; ``open(route)`` gives a sample its URLs, ``close(id)`` returns its calls."""

    def __init__(self, http: Any) -> None:
        self.http = http  # a shared httpx.AsyncClient
        self.routes: dict[str, Route] = {}
        self.url = ""
        self.app = Starlette(
            routes=[HTTPRoute("/r/{rid}/{wire}/{path:path}", self._forward, methods=["GET", "POST", "DELETE"])]
        )
        self._server: Any = None
        self._task: asyncio.Task | None = None

    async def start(self) -> str:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        config = uvicorn.Config(self.app, log_level="warning", lifespan="off", access_log=False)
        self._server = _InLoopServer(config)
        self._task = asyncio.get_running_loop().create_task(self._server.serve(sockets=[sock]))
        while not self._server.started:
            if self._task.done():
                raise RuntimeError(f"the eval's recording proxy failed to start: {self._task.exception()!r}")
            await asyncio.sleep(0.005)
        return self.url

    async def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            with contextlib.suppress(Exception):
                await self._task
        self._server = self._task = None

    def open(self, route: Route) -> tuple[str, str, str]:
        """``(route id, OpenAI base_url, Anthropic base_url)`` for one sample."""
        rid = uuid.uuid4().hex
        self.routes[rid] = route
        return rid, f"{self.url}/r/{rid}/openai", f"{self.url}/r/{rid}/anthropic"

    def close(self, rid: str) -> list[dict[str, Any]]:
        route = self.routes.pop(rid, None)
        return route.calls if route is not None else []

    async def _forward(self, request: Request) -> Response:
        route = self.routes.get(request.path_params["rid"])
        wire = request.path_params["wire"]
        if route is None or wire not in ("openai", "anthropic"):
            return JSONResponse({"error": {"message": "unknown eval route (the sample has ended)"}}, status_code=404)
        base = route.openai_base if wire == "openai" else route.anthropic_root
        body = await request.body()
        data = _json(body)
        wants_seed = wire == "openai" and isinstance(data, dict) and "messages" in data and data.get("seed") is None
        if wants_seed and route.seed is not None:
            data["seed"] = route.seed
            body = json.dumps(data).encode()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        upstream = self.http.build_request(
            request.method,
            f"{base.rstrip('/')}/{request.path_params['path']}",
            params=request.query_params,
            headers=headers,
            content=body,
        )
        try:
            response = await self.http.send(upstream, stream=True)
        except httpx.HTTPError as exc:
            message = f"the eval proxy could not reach {base}: {type(exc).__name__}: {exc}"
            route.calls.append({"wire": wire, "status": 502, "request": data, "response": None, "error": message})
            return JSONResponse({"error": {"message": message, "type": "server_error"}}, status_code=502)
        out_headers = {k: v for k, v in response.headers.items() if k.lower() not in HOP_HEADERS | {"content-encoding"}}
        if isinstance(data, dict) and data.get("stream"):
            body_iter = _recorded_stream(response, route, wire, data)
            return StreamingResponse(body_iter, status_code=response.status_code, headers=out_headers)
        content = await response.aread()
        await response.aclose()
        if isinstance(data, dict) and "messages" in data:
            route.calls.append(
                {"wire": wire, "status": response.status_code, "request": data, "response": _json(content)}
            )
        return Response(content, status_code=response.status_code, headers=out_headers)


async def _recorded_stream(response: Any, route: Route, wire: str, data: dict[str, Any]) -> Any:
    """Pass a streamed reply through; record the call once it ends (before its last chunk goes out, where the end is
    visible: Chat Completions' ``[DONE]``), its reply reassembled on the OpenAI wire."""
    seen: list[bytes] = []
    recorded = False

    def record() -> None:
        nonlocal recorded
        if not recorded and "messages" in data:
            ok = wire == "openai" and response.status_code < 400
            reply = _chat_completion(b"".join(seen)) if ok else None
            route.calls.append({"wire": wire, "status": response.status_code, "request": data, "response": reply})
        recorded = True

    try:
        async for chunk in response.aiter_bytes():
            seen.append(chunk)
            if b"data: [DONE]" in chunk:
                record()
            yield chunk
    finally:
        record()
        await response.aclose()


def _chat_completion(sse: bytes) -> dict[str, Any] | None:
    """The ``chat.completion`` a streamed Chat Completions reply adds up to (choice 0), or None if it is not one."""
    content: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    head: dict[str, Any] = {}
    finish = usage = None
    for line in sse.decode(errors="replace").splitlines():
        payload = line[len("data:") :].strip() if line.startswith("data:") else ""
        if not payload or payload == "[DONE]":
            continue
        chunk = _json(payload.encode())
        if not isinstance(chunk, dict):
            return None
        head = head or {k: chunk.get(k) for k in ("id", "created", "model")}
        usage = chunk.get("usage") or usage
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) == 0:
                delta = choice.get("delta") or {}
                content.append(delta.get("content") or "")
                for part in delta.get("tool_calls") or []:
                    call = calls.setdefault(part.get("index", 0), {"id": None, "type": "function", "function": {}})
                    call["id"] = part.get("id") or call["id"]
                    for key, value in (part.get("function") or {}).items():
                        call["function"][key] = call["function"].get(key, "") + (value or "")
                finish = choice.get("finish_reason") or finish
    if not head:
        return None
    message = {
        "role": "assistant",
        "content": "".join(content),
        **({"tool_calls": list(calls.values())} if calls else {}),
    }
    choice = {"index": 0, "message": message, "finish_reason": finish}
    return {**head, "object": "chat.completion", "choices": [choice], **({"usage": usage} if usage else {})}


def _json(raw: bytes) -> Any:
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return None


class _InLoopServer(uvicorn.Server):
    """uvicorn on the eval's own loop: it must not take over the process's signal handlers."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield
