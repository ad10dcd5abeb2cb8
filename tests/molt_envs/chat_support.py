"""Shared pieces of the molt_envs tests: engines that record or script what the model says."""

from __future__ import annotations

from collections.abc import Callable

from molt_envs import Generation, SamplingParams


class RecordingEngine:
    """The real engine, remembering every call: the exact ids it generated over and what it returned."""

    def __init__(self, engine):
        self.engine, self.calls, self.mm = engine, [], []  # mm: each call's VisionInputs (None without images)

    async def generate(self, prompt_ids, params, images=None):
        gen = await self.engine.generate(prompt_ids, params, images)
        self.calls.append((list(prompt_ids), params, gen))
        self.mm.append(images)
        return gen


class ScriptedEngine:
    """A test double that 'generates' chosen text (to force tool calls, end-of-turn tokens, ...).

    ``script(call_index, prompt_ids) -> text``; the ids are the tokenizer's encoding of the text plus the
    end-of-sequence token (so the reply ends with a stop), cut at ``max_tokens``. Log-probs are distinct per token.
    """

    def __init__(
        self, tokenizer, script: Callable[[int, list[int]], str] | list[str], *, stop: bool = True, fail_first: int = 0
    ):
        self.tokenizer, self.script, self.stop, self.calls, self.fail_first = tokenizer, script, stop, [], fail_first

    async def generate(self, prompt_ids, params: SamplingParams, images=None) -> Generation:
        if self.fail_first > 0:
            self.fail_first -= 1
            raise RuntimeError("scripted engine failure")
        n = len(self.calls)
        text = self.script(n, prompt_ids) if callable(self.script) else self.script[n % len(self.script)]
        ids = self.tokenizer.encode(text, add_special_tokens=False) + (
            [self.tokenizer.eos_token_id] if self.stop else []
        )
        ids = ids[: params.max_tokens]
        finish = "stop" if self.stop and ids and ids[-1] == self.tokenizer.eos_token_id else "length"
        gen = Generation(ids, [-0.01 * (n + 1) - 0.001 * i for i in range(len(ids))], finish)
        self.calls.append((list(prompt_ids), params, gen))
        return gen


def render(tokenizer, messages, tools=None, generation_prompt=True) -> str:
    return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=generation_prompt)


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


CALC_TOOL = {
    "type": "function",
    "function": {
        "name": "calc",
        "description": "evaluate arithmetic",
        "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}, "required": ["expr"]},
    },
}
ANTHROPIC_CALC_TOOL = {
    "name": "calc",
    "description": "evaluate arithmetic",
    "input_schema": CALC_TOOL["function"]["parameters"],
}
