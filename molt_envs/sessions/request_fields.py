"""Typed reads of JSON request fields for the wires; a wrong value is a ``BadRequest`` that names it."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import fields
from typing import Any

from molt_envs.contract import SamplingParams
from molt_envs.sessions.session import BadRequest


def optional(body: dict[str, Any], name: str, kind: type | tuple[type, ...], what: str) -> Any:
    """``body[name]`` if present and not null; it must be an instance of ``kind`` (bools are not numbers)."""
    value = body.get(name)
    if value is None:
        return None
    numeric = kind in (int, float) or (isinstance(kind, tuple) and int in kind)
    if not isinstance(value, kind) or (numeric and isinstance(value, bool)):
        raise BadRequest(f"{name} must be {what}, got {json.dumps(value)[:80]}")
    return value


def sampling_overrides(body: dict[str, Any], max_tokens_fields: tuple[str, ...]) -> dict[str, Any]:
    """The SamplingParams fields a request sets: max tokens, temperature, top_p, top_k, seed."""
    overrides: dict[str, Any] = {}
    for name in max_tokens_fields:
        value = optional(body, name, int, "a positive integer")
        if value is not None:
            if value < 1:
                raise BadRequest(f"{name} must be a positive integer, got {value}")
            overrides["max_tokens"] = value
            break
    for name in ("temperature", "top_p"):
        value = optional(body, name, (int, float), "a number")
        if value is not None:
            overrides[name] = float(value)
    top_k = optional(body, "top_k", int, "an integer")
    if top_k is not None:
        overrides["top_k"] = top_k
    seed = optional(body, "seed", int, "an integer in [0, 2**63)")
    if seed is not None:
        if not 0 <= seed < 2**63:
            raise BadRequest(f"seed must be an integer in [0, 2**63), got {seed}")
        overrides["seed"] = seed
    return overrides


def text_of(content: Any, where: str, text_types: tuple[str, ...] = ("text",)) -> str:
    """Content at ``where`` as text: null, a string, or a list of text parts (``text_types`` name them per wire).

    Any other part (an image, a file, audio) is refused with a 400 naming it; user content that may hold images is
    read with ``content_of``.
    """
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadRequest(f"{where} must be a string or a list of content parts, got {type(content).__name__}")
    return "".join(_text_part(part, f"{where}[{i}]", text_types) for i, part in enumerate(content))


def _text_part(part: Any, at: str, text_types: tuple[str, ...]) -> str:
    if not isinstance(part, dict) or not isinstance(part.get("type"), str):
        raise BadRequest(f"{at} must be an object with a 'type'")
    key = "refusal" if part["type"] == "refusal" else "text"
    if part["type"] not in text_types and part["type"] != "refusal":
        raise BadRequest(f"{at} has type {part['type']!r}; this field accepts only {' / '.join(text_types)} parts")
    if not isinstance(part.get(key), str):
        raise BadRequest(f"{at}.{key} must be a string")
    return part[key]


def content_of(
    content: Any,
    where: str,
    image_parts: dict[str, Callable[[dict[str, Any], str], str]],
    vision: bool,
    text_types: tuple[str, ...] = ("text",),
) -> str | list[dict[str, Any]]:
    """User content that may hold images: a string when it is all text (exactly ``text_of``), else parts
    ``{"type": "text", "text": ...}`` and ``{"type": "image", "image": <base64 data>}`` in order.

    ``image_parts`` maps the wire's image part types to its reading of one: ``read(part, at)`` returns the base64
    data (a remote URL is a 400: the server fetches nothing). The images are decoded later, off the event loop.
    ``vision``: whether the model reads images; on a text-only model an image part is a 400 naming it.
    """
    if not isinstance(content, list):
        return text_of(content, where, text_types)
    parts: list[dict[str, Any]] = []
    for i, part in enumerate(content):
        at = f"{where}[{i}]"
        kind = part.get("type") if isinstance(part, dict) else None
        read = image_parts.get(kind) if isinstance(kind, str) else None  # a non-string type is the text check's 400
        if read is None:
            parts.append({"type": "text", "text": _text_part(part, at, text_types)})
        else:
            parts.append(image_part(read, part, at, vision))
    return joined(parts)


def image_part(
    read: Callable[[dict[str, Any], str], str], part: dict[str, Any], at: str, vision: bool
) -> dict[str, Any]:
    """``{"type": "image", "image": <base64 data>}`` read from a wire's image part; a 400 on a text-only model."""
    if not vision:
        raise BadRequest(
            f"{at} has type {part.get('type')!r}, and the model behind this server is text-only: it accepts only "
            "text parts"
        )
    return {"type": "image", "image": read(part, at)}


def joined(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """Text and image parts as content: one string when there is no image."""
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts


def data_uri(url: Any, at: str) -> str:
    """The base64 data of a ``data:`` URI (an OpenAI ``image_url``); any other URL is a 400: nothing is fetched."""
    if not isinstance(url, str):
        raise BadRequest(f"{at} must be a data: URI string (data:image/png;base64,...)")
    head, sep, data = url.partition(",")
    if not (url.startswith("data:") and sep and head.endswith(";base64")):
        shown = url[:60] + ("..." if len(url) > 60 else "")
        raise BadRequest(
            f"{at} is {shown!r}: this server fetches no URLs; send the image inline as a base64 data: URI "
            "(data:image/png;base64,...)"
        )
    return data


def optional_str(value: Any, where: str) -> str:
    """An id-like field: a string, or null (empty)."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise BadRequest(f"{where} must be a string, got {json.dumps(value)[:80]}")
    return value


def session_params(value: Any, base: SamplingParams) -> SamplingParams:
    """``POST /sessions``'s ``sampling_params``: an object of SamplingParams fields, each type-checked."""
    if not isinstance(value, dict):
        raise BadRequest("sampling_params must be an object of SamplingParams fields")
    known = {f.name for f in fields(SamplingParams)}
    unknown = sorted(set(value) - known)
    if unknown:
        raise BadRequest(
            f"sampling_params has unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
        )
    overrides = sampling_overrides(value, ("max_tokens",))
    min_tokens = optional(value, "min_tokens", int, "a non-negative integer")
    if min_tokens is not None:
        if min_tokens < 0:
            raise BadRequest(f"min_tokens must be a non-negative integer, got {min_tokens}")
        overrides["min_tokens"] = min_tokens
    stops = optional(value, "stop_token_ids", list, "a list of token ids")
    if stops is not None:
        if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in stops):
            raise BadRequest(f"stop_token_ids must be a list of non-negative integers, got {json.dumps(stops)[:80]}")
        overrides["stop_token_ids"] = stops
    try:
        return base.updated(**overrides)
    except ValueError as exc:
        raise BadRequest(str(exc)) from None
