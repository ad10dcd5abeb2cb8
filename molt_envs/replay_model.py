"""A model-free stand-in for conformance checks: a byte-level ChatML tokenizer and an engine that replays set text.

``molt-env check`` runs a ChatAgent for real (its SDK, the session server, token capture) without weights: the
``ReplayEngine`` answers every call with one chosen completion (a dataset reference, or garbage), encoded by the
``ByteChatTokenizer``, so the check can assert what the agent's grading makes of it.
"""

from __future__ import annotations

import json
import re
from typing import Any

from molt_envs.contract import SamplingParams
from molt_envs.engine import Generation

SPECIALS = ("<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>")
_SPLIT = re.compile("(" + "|".join(re.escape(s) for s in SPECIALS) + ")")


class ByteChatTokenizer:
    """Bytes are ids 0-255, ``SPECIALS`` follow; ChatML with Qwen-style tools, rendered in Python."""

    chat_template = "chatml (rendered by ByteChatTokenizer.apply_chat_template)"
    eos_token = "<|im_end|>"
    eos_token_id = 256 + SPECIALS.index("<|im_end|>")

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids: list[int] = []
        for piece in _SPLIT.split(text):
            ids += [256 + SPECIALS.index(piece)] if piece in SPECIALS else list(piece.encode("utf-8"))
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        out, run = [], bytearray()
        for i in ids:
            if i < 256:
                run.append(i)
                continue
            out.append(run.decode("utf-8", errors="replace"))
            run = bytearray()
            if not skip_special_tokens:
                out.append(SPECIALS[i - 256])
        return "".join(out) + run.decode("utf-8", errors="replace")

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        tokenize: bool = False,
        add_generation_prompt: bool = False,
    ) -> str:
        parts = []
        system = messages[0]["content"] if messages and messages[0]["role"] == "system" else None
        if tools:
            listed = "\n".join(json.dumps(t) for t in tools)
            parts.append(
                f"<|im_start|>system\n{system + chr(10) * 2 if system else ''}# Tools\n<tools>\n{listed}\n"
                "</tools><|im_end|>\n"
            )
        elif system is not None:
            parts.append(f"<|im_start|>system\n{system}<|im_end|>\n")
        for i, m in enumerate(messages):
            if i == 0 and system is not None:
                continue
            if m["role"] == "assistant":
                calls = "".join(f"<tool_call>\n{json.dumps(_call(c))}\n</tool_call>" for c in m.get("tool_calls") or [])
                parts.append(f"<|im_start|>assistant\n{m.get('content') or ''}{calls}<|im_end|>\n")
            elif m["role"] == "tool":
                first = i == 0 or messages[i - 1]["role"] != "tool"
                last = i == len(messages) - 1 or messages[i + 1]["role"] != "tool"
                parts.append(
                    ("<|im_start|>user" if first else "") + f"\n<tool_response>\n{m['content']}\n"
                    "</tool_response>" + ("<|im_end|>\n" if last else "")
                )
            else:
                parts.append(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n")
        return "".join(parts) + ("<|im_start|>assistant\n" if add_generation_prompt else "")


def _call(call: dict[str, Any]) -> dict[str, Any]:
    fn = call.get("function", call)
    arguments = fn.get("arguments", {})
    return {"name": fn["name"], "arguments": json.loads(arguments) if isinstance(arguments, str) else arguments}


class ReplayEngine:
    """Every ``generate`` returns ``text`` (+ end-of-turn), cut at ``max_tokens``; log-probs are 0.0 (no model).

    ``text`` may be a list: the i-th call answers its i-th item (``molt-env eval --reverify`` replays stored replies
    this way); a call past the end raises ``LookupError``.
    """

    def __init__(self, tokenizer: ByteChatTokenizer, text: str | list[str]) -> None:
        self.script = [text] if isinstance(text, str) else list(text)
        self.replay = not isinstance(text, str)
        self.encoded = [tokenizer.encode(t) + [tokenizer.eos_token_id] for t in self.script]
        self.eos = tokenizer.eos_token_id
        self.calls = 0

    async def generate(
        self, prompt_ids: list[int], params: SamplingParams, images: list[Any] | None = None
    ) -> Generation:
        if self.replay and self.calls >= len(self.encoded):
            raise LookupError(
                f"the replayed episode has {len(self.encoded)} model replies; call {self.calls + 1} has none"
            )
        ids = self.encoded[min(self.calls, len(self.encoded) - 1)][: params.max_tokens]
        self.calls += 1
        return Generation(ids, [0.0] * len(ids), "stop" if ids and ids[-1] == self.eos else "length")
