"""Typed reads of JSON request fields for both wires; a wrong value is a ``BadRequest`` that names it."""

from __future__ import annotations

import json
from dataclasses import fields
from typing import Any

from molt_envs.contract import SamplingParams
from molt_envs.sessions import BadRequest


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

    Any other part (an image, a file, audio) is refused with a 400 naming it: the engine behind this server is
    text-only. This is the one place a vision engine's image parts would be let through.
    """
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadRequest(f"{where} must be a string or a list of content parts, got {type(content).__name__}")
    texts = []
    for i, part in enumerate(content):
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise BadRequest(f"{where}[{i}] must be an object with a 'type'")
        key = "refusal" if part["type"] == "refusal" else "text"
        if part["type"] not in text_types and part["type"] != "refusal":
            raise BadRequest(
                f"{where}[{i}] has type {part['type']!r}; this server's text engine accepts only "
                f"{' / '.join(text_types)} parts"
            )
        if not isinstance(part.get(key), str):
            raise BadRequest(f"{where}[{i}].{key} must be a string")
        texts.append(part[key])
    return "".join(texts)


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
