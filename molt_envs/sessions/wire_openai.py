"""The OpenAI Chat Completions wire: decode a request into a ``ChatRequest``, encode a ``Reply`` (JSON or SSE).

Honoured: ``messages`` (text content, and ``image_url`` parts in user messages as base64 ``data:`` URIs when the model
reads images: a remote URL is a 400, the server fetches nothing; ``tool_calls``, ``tool`` results), ``tools``, ``tool_choice`` ("none" turns
parsing off), ``max_completion_tokens``/``max_tokens``, ``temperature``, ``top_p``, ``top_k``, ``seed``, ``n`` (up to ``MAX_N``
choices, sampled by concurrent engine calls the engine batches; choice ``i`` from seed ``seed + i``; each choice
carries its own ``usage``, a molt extension, next to the request's summed ``usage``), ``stream``, ``stream_options.include_usage``. Other fields (``stop`` strings, ``logprobs``, ...) are accepted and
ignored: generation stops on tokens, and capture records log-probs anyway. Unset sampling fields take the session's
``SamplingParams``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

from molt_envs.sessions.request_fields import content_of, data_uri, optional, optional_str, sampling_overrides, text_of
from molt_envs.sessions.session import BadRequest, ChatRequest, Reply, Session, WireCall

ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_N = 128


def decode(body: dict[str, Any], session: Session | None = None) -> WireCall:
    """A Chat Completions request as a ``WireCall``.

    Args:
        body: the request's JSON object.
        session: unused (the wires share one signature).

    Returns:
        The decoded call; ``options["include_usage"]`` from ``stream_options``.

    Raises:
        BadRequest: naming the malformed field (messages, tools, ``n`` outside ``1..MAX_N``, sampling fields).
    """
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise BadRequest("messages must be a non-empty list of chat messages")
    vision = session is not None and session.template.codec is not None
    messages = [_message(m, i, vision) for i, m in enumerate(raw)]
    tools = optional(body, "tools", list, "a list of function tools")
    for i, tool in enumerate(tools or []):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if (
            not isinstance(fn, dict)
            or not isinstance(fn.get("name"), str)
            or not isinstance(fn.get("parameters", {}), dict)
        ):
            raise BadRequest(
                f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ..., 'parameters': {{...}}}}}}"
            )
    n = optional(body, "n", int, f"an integer in 1..{MAX_N}")
    if n is not None and not 1 <= n <= MAX_N:
        raise BadRequest(f"n must be an integer in 1..{MAX_N} (choices per call), got {n}")
    stream = bool(optional(body, "stream", bool, "a boolean"))
    options = optional(body, "stream_options", dict, "an object") or {}
    request = ChatRequest(
        messages,
        tools or None,
        sampling_overrides(body, ("max_completion_tokens", "max_tokens")),
        parse_tools=body.get("tool_choice") != "none",
        n=n or 1,
    )
    return WireCall(request, stream, {"include_usage": bool(options.get("include_usage"))})


def _message(message: Any, i: int, vision: bool = False) -> dict[str, Any]:
    where = f"messages[{i}]"
    if not isinstance(message, dict):
        raise BadRequest(f"{where} must be an object with 'role' and 'content', got {type(message).__name__}")
    role = message.get("role")
    if role not in ROLES:
        raise BadRequest(f"{where}.role must be one of {', '.join(ROLES)}; got {role!r}")
    content = message.get("content")
    out: dict[str, Any] = {
        "role": "system" if role == "developer" else role,
        "content": content_of(content, f"{where}.content", IMAGE_PARTS, vision)
        if role == "user"
        else text_of(content, f"{where}.content"),
    }
    calls = message.get("tool_calls")
    if role == "assistant" and calls is not None:
        if not isinstance(calls, list):
            raise BadRequest(f"{where}.tool_calls must be a list, got {json.dumps(calls)[:80]}")
        if calls:
            out["tool_calls"] = [_tool_call(c, f"{where}.tool_calls[{j}]") for j, c in enumerate(calls)]
    if role == "tool":
        out["tool_call_id"] = optional_str(message.get("tool_call_id"), f"{where}.tool_call_id")
    return out


def _image_url(part: dict[str, Any], at: str) -> str:
    url = part.get("image_url")
    return data_uri(url.get("url") if isinstance(url, dict) else url, f"{at}.image_url.url")


IMAGE_PARTS = {"image_url": _image_url}


def _tool_call(call: Any, where: str) -> dict[str, Any]:
    fn = call.get("function") if isinstance(call, dict) else None
    arguments = fn.get("arguments", "{}") if isinstance(fn, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not isinstance(arguments, str | dict):
        raise BadRequest(
            f"{where} must be {{'id': ..., 'type': 'function', 'function': {{'name': str, "
            "'arguments': JSON string}}}}"
        )
    if isinstance(arguments, dict):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return {
        "id": optional_str(call.get("id"), f"{where}.id"),
        "type": "function",
        "function": {"name": fn["name"], "arguments": arguments},
    }


def _tool_calls(reply: Reply) -> list[dict[str, Any]]:
    return [
        {"id": f"call_{c.id}", "type": "function", "function": {"name": c.name, "arguments": c.arguments_json}}
        for c in reply.tool_calls
    ]


def _usage(reply: Reply) -> dict[str, int]:
    return {
        "prompt_tokens": reply.prompt_tokens,
        "completion_tokens": reply.completion_tokens,
        "total_tokens": reply.prompt_tokens + reply.completion_tokens,
    }


def _choices(reply: Reply, call: WireCall | None) -> list[Reply]:
    """Every choice of the call (``options["choices"]``, set by the server for ``n`` > 1), else ``reply``."""
    return (call.options.get("choices") if call is not None else None) or [reply]


def _summed_usage(replies: list[Reply]) -> dict[str, int]:
    """OpenAI's ``usage`` of an ``n``-choice call: the prompt once, the completions summed."""
    completion = sum(r.completion_tokens for r in replies)
    prompt = replies[0].prompt_tokens
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def encode(reply: Reply, model: str, call: WireCall | None = None, session: Session | None = None) -> dict[str, Any]:
    """A reply as a ``chat.completion`` object.

    Args:
        reply: the session's reply (choice 0).
        model: the model name to carry.
        call: the decoded call; its ``options["choices"]`` holds every choice of an ``n`` > 1 call.
        session: unused (the wires share one signature).

    Returns:
        The JSON object: the choices (content, ``tool_calls``, finish reason, and with ``n`` > 1 each choice's own
        ``usage``) and ``usage`` (summed over the choices).
    """
    replies = _choices(reply, call)
    choices = []
    for i, r in enumerate(replies):
        message: dict[str, Any] = {"role": "assistant", "content": r.content}
        if r.tool_calls:
            message["content"] = r.content or None
            message["tool_calls"] = _tool_calls(r)
        choice = {"index": i, "message": message, "finish_reason": r.finish_reason, "logprobs": None}
        if len(replies) > 1:
            choice["usage"] = _usage(r)
        choices.append(choice)
    return {
        "id": f"chatcmpl-{reply.id}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": _summed_usage(replies),
    }


def encode_stream(reply: Reply, model: str, call: WireCall, session: Session | None = None) -> Iterator[str]:
    """A reply as SSE ``chat.completion.chunk`` events.

    Args:
        reply, model: as for ``encode``.
        call: the decoded call (``include_usage`` adds the usage chunk).
        session: unused.

    Returns:
        The events, per choice (``index``): role, content, tool calls, finish reason; then [usage], ``[DONE]``.
    """
    include_usage = call.options.get("include_usage", False)
    replies = _choices(reply, call)
    head = {
        "id": f"chatcmpl-{reply.id}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
    }

    def chunk(index: int, delta: dict[str, Any], finish: str | None = None) -> str:
        choice = {"index": index, "delta": delta, "finish_reason": finish, "logprobs": None}
        return _event({**head, "choices": [choice]})

    for index, r in enumerate(replies):
        yield chunk(index, {"role": "assistant", "content": ""})
        if r.content:
            yield chunk(index, {"content": r.content})
        for i, tool_call in enumerate(_tool_calls(r)):
            yield chunk(index, {"tool_calls": [{"index": i, **tool_call}]})
        yield chunk(index, {}, r.finish_reason)
    if include_usage:
        yield _event({**head, "choices": [], "usage": _summed_usage(replies)})
    yield "data: [DONE]\n\n"


def _event(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


def error(message: str, status: int) -> dict[str, Any]:
    """An error body in OpenAI's shape.

    Args:
        message: what is wrong and what to do.
        status: the HTTP status it goes with.

    Returns:
        ``{"error": {"message", "type", "param", "code"}}``.
    """
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "param": None, "code": status}}
