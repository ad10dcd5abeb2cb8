"""Structured tool calls out of model text: Hermes/Qwen ``<tool_call>{json}</tool_call>`` blocks.

``parse_tool_calls`` splits a completion into its plain text and the calls it makes. It is all or nothing: if any
block is malformed (not JSON, no ``name``, arguments that are not an object, an unclosed tag) the whole completion is
returned as plain content with no calls, so a confused model never turns into a server error.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: dict[str, Any]

    @property
    def arguments_json(self) -> str:
        return json.dumps(self.arguments, ensure_ascii=False)


def parse_tool_calls(text: str) -> tuple[str, list[ToolCall]]:
    """``(content, calls)``; ``content`` is the text outside the blocks, stripped. Malformed → ``(text, [])``.

    Each call gets a fresh hex ``id``; the wires prefix it (``call_`` for OpenAI, ``toolu_`` for Anthropic).
    """
    if OPEN not in text:
        return text, []
    calls = []
    for block in _BLOCK.findall(text):
        call = _parse_block(block)
        if call is None:
            return text, []
        calls.append(call)
    outside = _BLOCK.sub("", text)
    if OPEN in outside or CLOSE in outside:  # an unclosed or stray tag: not a well-formed call
        return text, []
    return outside.strip(), calls


def _parse_block(block: str) -> ToolCall | None:
    try:
        data = json.loads(block)
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("name"), str) or not data["name"]:
        return None
    arguments = data.get("arguments", data.get("parameters", {}))
    if isinstance(arguments, str):  # some models emit the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    try:  # NaN, Infinity (or 1e999) and unpaired surrogates parse, but no JSON reply can carry them: plain text
        json.dumps([data["name"], arguments], ensure_ascii=False, allow_nan=False).encode()
    except ValueError:
        return None
    return ToolCall(id=uuid.uuid4().hex[:24], name=data["name"], arguments=arguments)
