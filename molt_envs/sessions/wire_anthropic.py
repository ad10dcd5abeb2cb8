"""The Anthropic Messages wire (as the SDK and Claude Code speak it), decoded into the OpenAI message shape.

``system`` (a string or text blocks) becomes the first message, and system-role entries inside ``messages`` (Claude
Code puts its environment notes there) stay system messages where they are; assistant ``tool_use`` blocks become
``tool_calls``; a user turn's ``tool_result`` blocks (a string or an array of text blocks) become ``tool`` messages
(in order, before the turn's remaining text), and each must answer a ``tool_use`` made earlier in the conversation;
``thinking`` blocks become the assistant message's ``reasoning_content`` where the template renders one (else, and
``redacted_thinking`` always, they are dropped); ``cache_control`` markers, ``metadata``, ``thinking``/
``context_management``/``output_config`` settings and beta headers are accepted and have no effect. Anthropic tools
become OpenAI function tools; server tools (no ``input_schema``: web search, code execution, ...) are not shown to
the model, since this server runs no tools. Replies carry ``text`` and ``tool_use`` blocks; streaming uses
Anthropic's event sequence. Honoured: ``max_tokens``, ``temperature``/``top_p``/``top_k`` (raw HTTP; recent SDKs no
longer send them, so the session's ``SamplingParams`` apply), ``tool_choice`` ``{"type": "none"}``, ``stream``.
``image`` blocks (``source.type: "base64"``) in user turns and inside ``tool_result`` content are images when the
model reads them; a ``url`` source is a 400 (the server fetches nothing), and so is any image on a text-only model.
What the chat template cannot represent (document blocks, ...) is a 400 naming it.
``count_tokens`` answers ``POST /v1/messages/count_tokens`` with the rendered prompt's real token count.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from molt_envs.sessions.request_fields import (
    content_of,
    image_part,
    joined,
    optional,
    optional_str,
    sampling_overrides,
    text_of,
)
from molt_envs.sessions.session import BadRequest, ChatRequest, Reply, Session, WireCall

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
ROLES = ("user", "assistant", "system")


def decode(body: dict[str, Any], session: Session | None = None) -> WireCall:
    """A Messages request as a ``WireCall``.

    Args:
        body: the request's JSON object.
        session: the session it is for (decides whether thinking blocks reach the template); None drops them.

    Returns:
        The decoded call (``stream`` from the body).

    Raises:
        BadRequest: naming the field or block that is malformed or cannot be represented (images, documents, a
            ``tool_result`` answering no earlier ``tool_use``).
    """
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise BadRequest("messages must be a non-empty list of {'role': 'user'|'assistant', 'content': ...}")
    reasoning = session is not None and session.template.renders_reasoning
    vision = session is not None and session.template.codec is not None
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if system:
        messages.append({"role": "system", "content": text_of(system, "system")})
    calls: set[str] = set()
    for i, message in enumerate(raw):
        messages += _messages(message, f"messages[{i}]", calls, reasoning, vision)
    given = optional(body, "tools", list, "a list of tools") or []
    tools = [tool for tool in (_tool(t, i) for i, t in enumerate(given)) if tool is not None]
    choice = optional(body, "tool_choice", dict, "an object") or {}
    stream = bool(optional(body, "stream", bool, "a boolean"))
    request = ChatRequest(
        messages, tools or None, sampling_overrides(body, ("max_tokens",)), parse_tools=choice.get("type") != "none"
    )
    return WireCall(request, stream)


def _image(block: dict[str, Any], at: str) -> str:
    """An ``image`` block's base64 data; a URL (or file) source is a 400: the server fetches nothing."""
    source = block.get("source")
    kind = source.get("type") if isinstance(source, dict) else None
    if kind != "base64" or not isinstance(source.get("data"), str):
        raise BadRequest(
            f"{at}.source must be {{'type': 'base64', 'media_type': 'image/png', 'data': ...}}; got type "
            f"{json.dumps(kind)[:40]}: this server fetches no URLs or files, send the image inline"
        )
    return source["data"]


IMAGE_BLOCKS = {"image": _image}


def _messages(message: Any, where: str, calls: set[str], reasoning: bool, vision: bool) -> list[dict[str, Any]]:
    if not isinstance(message, dict) or message.get("role") not in ROLES:
        raise BadRequest(
            f"{where} must be an object with role 'user', 'assistant' or 'system', got {json.dumps(message)[:80]}"
        )
    role, content = message["role"], message.get("content")
    if role == "system":
        return [{"role": "system", "content": text_of(content, f"{where}.content")}]
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise BadRequest(f"{where}.content must be a string or a list of content blocks")
    texts, thoughts, tool_calls, results = [], [], [], []
    for j, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        at = f"{where}.content[{j}]"
        if kind == "text":
            if not isinstance(block.get("text"), str):
                raise BadRequest(f"{at}.text must be a string")
            texts.append({"type": "text", "text": block["text"]})
        elif kind == "image" and role == "user":
            texts.append(image_part(_image, block, at, vision))
        elif kind == "tool_use" and role == "assistant":
            if not isinstance(block.get("name"), str) or not isinstance(block.get("input", {}), dict):
                raise BadRequest(f"{at} (tool_use) needs a string 'name' and an object 'input'")
            call_id = optional_str(block.get("id"), f"{at}.id")
            calls.add(call_id)
            arguments = json.dumps(block.get("input", {}), ensure_ascii=False)
            tool_calls.append(
                {"id": call_id, "type": "function", "function": {"name": block["name"], "arguments": arguments}}
            )
        elif kind == "tool_result" and role == "user":
            call_id = block.get("tool_use_id")
            if not isinstance(call_id, str) or call_id not in calls:
                raise BadRequest(
                    f"{at}.tool_use_id {json.dumps(call_id)[:60]} answers no tool_use of an earlier assistant "
                    "message; send the tool_use before its tool_result"
                )
            inner = content_of(block.get("content"), f"{at}.content", IMAGE_BLOCKS, vision)
            results.append({"role": "tool", "tool_call_id": call_id, "content": inner})
        elif kind == "thinking" and role == "assistant":
            if not isinstance(block.get("thinking"), str):
                raise BadRequest(f"{at}.thinking must be a string")
            thoughts.append(block["thinking"])
        elif kind == "redacted_thinking" and role == "assistant":
            continue  # encrypted by Anthropic's servers: nothing the template could render
        else:
            raise BadRequest(
                f"{at} has type {kind!r}, which a {role} message on this text server cannot carry; "
                "use text, thinking or tool_use (assistant) and text or tool_result (user) blocks"
            )
    text = joined(texts)  # a string unless it holds images
    if role == "assistant":
        out: dict[str, Any] = {"role": "assistant", "content": text}
        if tool_calls:
            out["tool_calls"] = tool_calls
        if thoughts and reasoning:
            out["reasoning_content"] = "\n".join(thoughts)
        return [out]
    return results + ([{"role": "user", "content": text}] if texts or not results else [])


def _tool(tool: Any, i: int) -> dict[str, Any] | None:
    """An OpenAI function tool, or None for a server tool (a ``type`` and no ``input_schema``)."""
    if isinstance(tool, dict) and tool.get("type") not in (None, "custom") and "input_schema" not in tool:
        return None
    if (
        not isinstance(tool, dict)
        or not isinstance(tool.get("name"), str)
        or not isinstance(tool.get("input_schema", {}), dict)
        or not isinstance(tool.get("description", ""), str)
    ):
        raise BadRequest(f"tools[{i}] must be {{'name': str, 'description': str, 'input_schema': {{...}}}}")
    return {
        "type": "function",
        "function": {
            "name": tool["name"],
            "description": tool.get("description", ""),
            "parameters": tool.get("input_schema", {"type": "object"}),
        },
    }


def _blocks(reply: Reply) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if reply.content or not reply.tool_calls:
        blocks.append({"type": "text", "text": reply.content})
    blocks += [
        {"type": "tool_use", "id": f"toolu_{c.id}", "name": c.name, "input": c.arguments} for c in reply.tool_calls
    ]
    return blocks


def encode(reply: Reply, model: str, call: WireCall | None = None, session: Session | None = None) -> dict[str, Any]:
    """A reply as a Messages ``message`` object.

    Args:
        reply: the session's reply.
        model: the model name to carry.
        call, session: unused (the wires share one signature).

    Returns:
        The JSON object: ``text`` and ``tool_use`` blocks, ``stop_reason``, ``usage``.
    """
    return {
        "id": f"msg_{reply.id}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": _blocks(reply),
        "stop_reason": STOP_REASONS[reply.finish_reason],
        "stop_sequence": None,
        "usage": {"input_tokens": reply.prompt_tokens, "output_tokens": reply.completion_tokens},
    }


def encode_stream(
    reply: Reply, model: str, call: WireCall | None = None, session: Session | None = None
) -> Iterator[str]:
    """A reply as Anthropic's SSE event sequence.

    Args:
        reply, model, call, session: as for ``encode``.

    Returns:
        The events: message_start, one start/delta/stop triple per content block, message_delta, message_stop.
    """
    message = {
        **encode(reply, model),
        "content": [],
        "stop_reason": None,
        "usage": {"input_tokens": reply.prompt_tokens, "output_tokens": 0},
    }
    yield _event("message_start", {"type": "message_start", "message": message})
    for i, block in enumerate(_blocks(reply)):
        if block["type"] == "text":
            start, delta = {"type": "text", "text": ""}, {"type": "text_delta", "text": block["text"]}
        else:
            start = {**block, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"], ensure_ascii=False)}
        yield _event("content_block_start", {"type": "content_block_start", "index": i, "content_block": start})
        yield _event("content_block_delta", {"type": "content_block_delta", "index": i, "delta": delta})
        yield _event("content_block_stop", {"type": "content_block_stop", "index": i})
    yield _event(
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": STOP_REASONS[reply.finish_reason], "stop_sequence": None},
            "usage": {"output_tokens": reply.completion_tokens},
        },
    )
    yield _event("message_stop", {"type": "message_stop"})


def _event(name: str, data: dict[str, Any]) -> str:
    return f"event: {name}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


def error(message: str, status: int) -> dict[str, Any]:
    """An error body in Anthropic's shape.

    Args:
        message: what is wrong and what to do.
        status: the HTTP status it goes with (picks the error type).

    Returns:
        ``{"type": "error", "error": {"type", "message"}}``.
    """
    kind = {400: "invalid_request_error", 404: "not_found_error", 413: "request_too_large"}.get(status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def count_tokens(body: dict[str, Any], session: Session) -> dict[str, int]:
    """``POST /v1/messages/count_tokens``: the tokens the model would read for this request (no generation).

    Args:
        body: a Messages request's JSON object.
        session: the session it is for.

    Returns:
        ``{"input_tokens": N}``, the template's real count.

    Raises:
        BadRequest: as ``decode``, or if the template refuses the conversation.
    """
    request = decode(body, session).request
    return {"input_tokens": session.template.count(request.messages, request.tools)}
