"""The OpenAI Responses wire (``POST /v1/responses``, what Codex and the Agents SDK speak) over the chat template.

``input`` (a string, or items: messages of any role, ``function_call``, ``function_call_output``, ``reasoning``)
becomes OpenAI chat messages: ``instructions`` first as a system message, ``developer`` as ``system``, function calls
folded into the assistant message before them, outputs as ``tool`` messages (each must answer a call made earlier in
the conversation), reasoning as the next assistant message's ``reasoning_content`` where the template renders one
(else it is dropped). ``previous_response_id`` continues a response this session stored: its conversation (without
its instructions, as the API does) comes before the new input. So a harness that resends the whole history (Codex,
``store: false``) and one that chains response ids land on the same messages, and the session captures both as one
token-exact continuation.

Tools: ``function`` tools, and ``namespace`` tools flattened to ``namespace.name`` functions (calls come back with
their ``namespace``); hosted tools (web search, file search, computer use, ...) are accepted and not shown to the
model: this server runs no tools. ``tool_choice`` "none" turns call parsing off. Honoured besides: ``store``
(default true: ``GET /v1/responses/{id}`` and ``previous_response_id`` find it), ``max_output_tokens``,
``temperature``, ``top_p``, ``stream`` (the event sequence of the API: created, in_progress, per item added /
content part / deltas / done, completed or incomplete). Fields that steer what this server cannot do
(``background``, ``conversation``) are refused naming them; the rest (``reasoning``, ``include``, ``metadata``,
``prompt_cache_key``, ...) are accepted and ignored.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from molt_envs.sessions.request_fields import content_of, data_uri, optional, optional_str, sampling_overrides, text_of
from molt_envs.sessions.session import BadRequest, ChatRequest, Reply, Session, WireCall
from molt_envs.sessions.wire_openai import error

__all__ = ["Stored", "decode", "encode", "encode_stream", "error", "stored_response"]

ROLES = ("user", "assistant", "system", "developer")
TEXT_PARTS = ("input_text", "output_text", "text")
# tool types the model is not shown: hosted ones (run by OpenAI's servers) and built-ins with a schema of their own
HIDDEN_TOOLS = (
    "web_search", "file_search", "computer", "code_interpreter", "image_generation", "mcp", "local_shell", "shell",
    "apply_patch", "tool_search", "custom",
)  # fmt: skip
REFUSED_FIELDS = {
    "background": "background responses are not served; call without it and wait for the answer",
    "conversation": "the Conversations API is not served; chain calls with previous_response_id instead",
}


@dataclass
class Stored:
    """One response a session keeps: the messages it added to its parent's conversation, and its JSON."""

    parent: str | None
    added: list[dict[str, Any]]
    body: dict[str, Any]


def decode(body: dict[str, Any], session: Session) -> WireCall:
    """A Responses request as a ``WireCall``: its messages follow ``previous_response_id``'s conversation.

    Args:
        body: the request's JSON object.
        session: the session it is for (holds the stored responses ``previous_response_id`` names).

    Returns:
        The decoded call; ``options`` keeps what ``encode`` needs (the parent, the added messages, tool namespaces,
        ``store`` and the fields a response echoes).

    Raises:
        BadRequest: naming the malformed or unsupported field or item (an unknown ``previous_response_id``, a
            ``function_call_output`` for a call that never happened, a refused field).
    """
    for name, why in REFUSED_FIELDS.items():
        if body.get(name):
            raise BadRequest(f"{name} is not supported: {why}")
    previous = optional(body, "previous_response_id", str, "the id of a response of this session")
    history = _conversation(session, previous) if previous else []
    instructions = body.get("instructions")
    system = [] if instructions is None else [{"role": "system", "content": text_of(instructions, "instructions")}]
    tools, namespaces = _tools(optional(body, "tools", list, "a list of tools") or [])
    raw = body.get("input")
    if isinstance(raw, str):
        items: list[Any] = [{"type": "message", "role": "user", "content": raw}]
    elif isinstance(raw, list) and raw:
        items = raw
    else:
        raise BadRequest("input must be a string or a non-empty list of input items")
    added = _messages(items, history, session.template.renders_reasoning, session.template.codec is not None)
    messages = system + history + added
    if not messages:
        raise BadRequest("input holds no message the model can read (reasoning items only)")
    choice = body.get("tool_choice")
    request = ChatRequest(
        messages, tools or None, sampling_overrides(body, ("max_output_tokens",)), parse_tools=choice != "none"
    )
    options = {
        "previous": previous,
        "added": added,
        "namespaces": namespaces,
        "store": optional(body, "store", bool, "a boolean") is not False,
        "echo": {
            "instructions": instructions,
            "tools": body.get("tools") or [],
            "tool_choice": choice if choice is not None else "auto",
            "parallel_tool_calls": body.get("parallel_tool_calls", True) is not False,
            "temperature": body.get("temperature"),
            "top_p": body.get("top_p"),
            "max_output_tokens": body.get("max_output_tokens"),
            "previous_response_id": previous,
            "metadata": body.get("metadata") if isinstance(body.get("metadata"), dict) else {},
        },
    }
    return WireCall(request, bool(optional(body, "stream", bool, "a boolean")), options)


def _conversation(session: Session, response_id: str) -> list[dict[str, Any]]:
    """The messages of a stored response's conversation, oldest first (its chain of parents walked back)."""
    chain, current = [], response_id
    while current is not None:
        stored = session.responses.get(current)
        if stored is None:
            raise BadRequest(
                f"previous_response_id {response_id!r} is not a stored response of this session (unknown, from "
                "another session, or sent with store: false); send the whole conversation as input instead"
            )
        chain.append(stored.added)
        current = stored.parent
    return [message for added in reversed(chain) for message in added]


def _tools(tools: list[Any]) -> tuple[list[dict[str, Any]], dict[str, tuple[str, str]]]:
    """OpenAI chat function tools, and the qualified name -> (namespace, name) of flattened namespace tools."""
    out: list[dict[str, Any]] = []
    namespaces: dict[str, tuple[str, str]] = {}
    for i, tool in enumerate(tools):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind == "function":
            out.append(_function(tool, f"tools[{i}]"))
        elif kind == "namespace":
            if not isinstance(tool.get("name"), str) or not isinstance(tool.get("tools"), list):
                raise BadRequest(f"tools[{i}] (namespace) needs a string 'name' and a list 'tools'")
            for j, inner in enumerate(tool["tools"]):
                if isinstance(inner, dict) and inner.get("type") == "function":
                    function = _function(inner, f"tools[{i}].tools[{j}]", prefix=f"{tool['name']}.")
                    namespaces[function["function"]["name"]] = (tool["name"], inner["name"])
                    out.append(function)
        elif not (isinstance(kind, str) and kind.startswith(HIDDEN_TOOLS)):
            raise BadRequest(
                f"tools[{i}] has type {kind!r}; use function tools ({{'type': 'function', 'name': ..., "
                "'parameters': {...}}}) or namespace tools of them"
            )
    return out, namespaces


def _function(tool: dict[str, Any], where: str, prefix: str = "") -> dict[str, Any]:
    name, parameters = tool.get("name"), tool.get("parameters")
    if not isinstance(name, str) or not name or not isinstance(parameters, dict | None):
        raise BadRequest(f"{where} must be {{'type': 'function', 'name': str, 'parameters': {{...}}}}")
    description = tool.get("description")
    if not isinstance(description, str | None):
        raise BadRequest(f"{where}.description must be a string")
    return {
        "type": "function",
        "function": {
            "name": prefix + name,
            "description": description or "",
            "parameters": parameters or {"type": "object", "properties": {}},
        },
    }


def _input_image(part: dict[str, Any], at: str) -> str:
    if part.get("image_url") is None and part.get("file_id") is not None:
        raise BadRequest(f"{at}.file_id: files are not served; send image_url as a base64 data: URI")
    return data_uri(part.get("image_url"), f"{at}.image_url")


def _messages(
    items: list[Any], history: list[dict[str, Any]], renders_reasoning: bool, vision: bool = False
) -> list[dict[str, Any]]:
    """Input items as chat messages; ``history`` (already valid) provides the calls that outputs may answer.
    ``input_image`` parts of user messages are images when the model reads them (``vision``)."""
    calls = {c["id"] for m in history for c in m.get("tool_calls") or []}
    out: list[dict[str, Any]] = []
    reasoning: list[str] = []
    for i, item in enumerate(items):
        at = f"input[{i}]"
        if not isinstance(item, dict):
            raise BadRequest(f"{at} must be an input item object, got {json.dumps(item)[:80]}")
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in ROLES:
                raise BadRequest(f"{at}.role must be one of {', '.join(ROLES)}; got {json.dumps(role)[:40]}")
            content = item.get("content")
            message = {
                "role": "system" if role == "developer" else role,
                "content": content_of(content, f"{at}.content", {"input_image": _input_image}, vision, TEXT_PARTS)
                if role == "user"
                else text_of(content, f"{at}.content", TEXT_PARTS),
            }
            if role == "assistant" and reasoning:
                message["reasoning_content"] = "\n".join(reasoning)
                reasoning = []
            out.append(message)
        elif kind == "function_call":
            call = _call(item, at)
            calls.add(call["id"])
            if out and out[-1]["role"] == "assistant":  # a reply's text and its calls are one assistant message
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
                if reasoning:
                    out[-1]["reasoning_content"] = "\n".join(reasoning)
                    reasoning = []
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str) or call_id not in calls:
                raise BadRequest(
                    f"{at}.call_id {json.dumps(call_id)[:60]} answers no function_call of this conversation; "
                    "send the function_call item (or previous_response_id) before its output"
                )
            content = text_of(item.get("output"), f"{at}.output", TEXT_PARTS)
            out.append({"role": "tool", "tool_call_id": call_id, "content": content})
        elif kind == "reasoning":
            text = _reasoning(item, at)
            if renders_reasoning and text:
                reasoning.append(text)
        else:
            raise BadRequest(
                f"{at}.type is {json.dumps(kind)[:60]}, which this server cannot represent; send message, "
                "function_call, function_call_output or reasoning items"
            )
    return out


def _call(item: dict[str, Any], at: str) -> dict[str, Any]:
    name, arguments = item.get("name"), item.get("arguments")
    if not isinstance(name, str) or not name or not isinstance(arguments, str):
        raise BadRequest(f"{at} (function_call) needs a string 'name', 'call_id' and 'arguments' (a JSON string)")
    call_id = optional_str(item.get("call_id"), f"{at}.call_id")
    if not call_id:
        raise BadRequest(f"{at}.call_id must be a non-empty string")
    namespace = optional_str(item.get("namespace"), f"{at}.namespace")
    qualified = f"{namespace}.{name}" if namespace else name
    return {"id": call_id, "type": "function", "function": {"name": qualified, "arguments": arguments}}


def _reasoning(item: dict[str, Any], at: str) -> str:
    texts = []
    for key, kind in (("summary", "summary_text"), ("content", "reasoning_text")):
        parts = item.get(key) or []
        if not isinstance(parts, list):
            raise BadRequest(f"{at}.{key} must be a list of {kind} parts")
        texts.append(text_of(parts, f"{at}.{key}", (kind,)))
    return "\n".join(t for t in texts if t)


def _output(reply: Reply, namespaces: dict[str, tuple[str, str]]) -> list[dict[str, Any]]:
    status = "incomplete" if reply.finish_reason == "length" else "completed"
    items: list[dict[str, Any]] = []
    if reply.content or not reply.tool_calls:
        text = {"type": "output_text", "text": reply.content, "annotations": [], "logprobs": []}
        items.append(
            {"type": "message", "id": f"msg_{reply.id}", "status": status, "role": "assistant", "content": [text]}
        )
    for call in reply.tool_calls:
        namespace, name = namespaces.get(call.name, (None, call.name))
        item = {
            "type": "function_call",
            "id": f"fc_{call.id}",
            "call_id": f"call_{call.id}",
            "name": name,
            "arguments": call.arguments_json,
            "status": "completed",
        }
        if namespace:
            item["namespace"] = namespace
        items.append(item)
    return items


def encode(reply: Reply, model: str, call: WireCall, session: Session) -> dict[str, Any]:
    """A reply as a ``response`` object, stored in the session (for ``previous_response_id`` and GET) unless
    ``store`` is off.

    Args:
        reply: the session's reply.
        model: the model name to carry.
        call: the decoded call (its ``options`` from ``decode``).
        session: the session that keeps the response.

    Returns:
        The JSON object (``status`` "incomplete" with ``max_output_tokens`` as the reason when cut off by length).
    """
    options = call.options
    incomplete = reply.finish_reason == "length"
    now = time.time()
    response = {
        "id": f"resp_{reply.id}",
        "object": "response",
        "created_at": now,
        "completed_at": None if incomplete else now,
        "status": "incomplete" if incomplete else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "error": None,
        "model": model,
        "output": _output(reply, options["namespaces"]),
        "usage": {
            "input_tokens": reply.prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": reply.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": reply.prompt_tokens + reply.completion_tokens,
        },
        "store": options["store"],
        "text": {"format": {"type": "text"}},
        "truncation": "disabled",
        **options["echo"],
    }
    if options["store"]:
        assistant: dict[str, Any] = {"role": "assistant", "content": reply.content}
        if reply.tool_calls:
            assistant["tool_calls"] = [
                {"id": f"call_{c.id}", "type": "function", "function": {"name": c.name, "arguments": c.arguments_json}}
                for c in reply.tool_calls
            ]
        session.responses[response["id"]] = Stored(options["previous"], [*options["added"], assistant], response)
    return response


def encode_stream(reply: Reply, model: str, call: WireCall, session: Session) -> Iterator[str]:
    """A reply as the Responses SSE event sequence (one delta per item: generation is not streamed).

    Args:
        reply, model, call, session: as for ``encode`` (the response is stored the same way).

    Returns:
        The events: created, in_progress, each output item's added/delta/done events, then completed or incomplete.
    """
    response = encode(reply, model, call, session)
    seq = iter(range(1 << 30))

    def event(kind: str, **data: Any) -> str:
        payload = {"type": kind, "sequence_number": next(seq), **data}
        return f"event: {kind}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n"

    start = {**response, "status": "in_progress", "output": [], "completed_at": None, "incomplete_details": None}
    yield event("response.created", response=start)
    yield event("response.in_progress", response=start)
    for index, item in enumerate(response["output"]):
        if item["type"] == "message":
            part = item["content"][0]
            ids = {"item_id": item["id"], "output_index": index, "content_index": 0}
            yield event("response.output_item.added", output_index=index, item={**item, "content": []})
            yield event("response.content_part.added", **ids, part={**part, "text": ""})
            if part["text"]:
                yield event("response.output_text.delta", **ids, delta=part["text"], logprobs=[])
            yield event("response.output_text.done", **ids, text=part["text"], logprobs=[])
            yield event("response.content_part.done", **ids, part=part)
        else:
            ids = {"item_id": item["id"], "output_index": index}
            yield event("response.output_item.added", output_index=index, item={**item, "arguments": ""})
            yield event("response.function_call_arguments.delta", **ids, delta=item["arguments"])
            yield event("response.function_call_arguments.done", **ids, name=item["name"], arguments=item["arguments"])
        yield event("response.output_item.done", output_index=index, item=item)
    yield event(f"response.{response['status']}", response=response)


def stored_response(session: Session, response_id: str) -> dict[str, Any] | None:
    """``GET /v1/responses/{id}``.

    Args:
        session: the session whose responses are looked up.
        response_id: a ``resp_...`` id.

    Returns:
        The stored response object, or None if this session stored no such response.
    """
    stored = session.responses.get(response_id)
    return stored.body if stored is not None else None
