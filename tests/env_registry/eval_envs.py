"""Envs the eval tests run by ``eval_envs:test/<name>-v1`` (the module registers them when imported).

- ``test/coin-v1`` (and ``test/coin1-v1``, the same declared single-turn): a sample passes when the sha256 of the model's answer starts with an even nibble, so a random
  tiny model passes about half the time, deterministically per sample seed. ``MOLT_TEST_FLIP=1`` inverts the grade
  (a "new grader" for ``--reverify``); ``CoinEnvV2``, its next version (registered by the test that needs it: a ``-v2`` deprecates ``-v1``), also flips it
  for answers of odd length.
- ``test/hang-v1``: the grader blocks its worker thread for an hour.
- ``test/chat-coin-v1``: ``test/coin-v1`` as a ChatAgent on the OpenAI SDK.
- ``test/tool-v1``: two turns, a tool call and its result in between; ``test/raw-v1``: raw-text observations.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time

from env_registry import register
from molt_envs import ChatAgent, ChatContext, Env, Result, StepState
from molt_envs.tool_calls import parse_tool_calls

DATA = {
    "generator": "eval_envs:rows",
    "input_key": "question",
    "label_key": "answer",
}


def rows(split: str, size: int = 12):
    for i in range(size):
        yield {"question": f"{split} question {i}: say something", "answer": str(i)}


def coin(text: str) -> float:
    heads = int(hashlib.sha256(text.encode()).hexdigest()[0], 16) % 2 == 0
    return float(heads != (os.environ.get("MOLT_TEST_FLIP") == "1"))


class CoinEnv(Env):
    async def step(self, state: StepState) -> Result:
        return Result(reward=coin(state["action_text"]), info={"chars": float(len(state["action_text"]))})


class CoinEnvV2(Env):
    """The coin's next version (``test/coin-v2`` where a test registers it), whose grade also flips for answers of odd length."""

    async def step(self, state: StepState) -> Result:
        text = state["action_text"]
        return Result(reward=abs(coin(text) - len(text) % 2))


class HangEnv(Env):
    async def step(self, state: StepState) -> Result:
        await asyncio.to_thread(time.sleep, 3600)
        return Result(reward=1.0)


class ToolEnv(Env):
    """Turn 0 must call ``lookup``; its result goes back as a tool message; turn 1 must repeat it."""

    async def step(self, state: StepState) -> Result:
        _, calls = parse_tool_calls(state["action_text"])
        if state["turn"] == 0:
            if not calls or calls[0].name != "lookup":
                return Result(reward=0.0, info={"invalid_action": 1.0})
            return Result(reward=0.0, terminated=False, observation=[{"role": "tool", "content": "42"}])
        return Result(reward=float("42" in state["action_text"]))


class RawTextEnv(Env):
    async def step(self, state: StepState) -> Result:
        return Result(reward=0.0, terminated=False, observation="<|im_start|>user\nmore<|im_end|>\n")


class ChatCoinAgent(ChatAgent):
    async def run(self, ctx: ChatContext) -> Result:
        from openai import AsyncOpenAI

        async with AsyncOpenAI(base_url=ctx.base_url, api_key=ctx.api_key) as client:
            reply = await client.chat.completions.create(
                model=ctx.model_name, messages=ctx.messages, max_tokens=ctx.sampling_params.max_tokens
            )
        return Result(reward=coin(reply.choices[0].message.content or ""))


for name, entry, kind in (
    ("test/coin-v1", "eval_envs:CoinEnv", "env"),
    ("test/hang-v1", "eval_envs:HangEnv", "env"),
    ("test/chat-coin-v1", "eval_envs:ChatCoinAgent", "chat_agent"),
    ("test/tool-v1", "eval_envs:ToolEnv", "env"),
    ("test/raw-v1", "eval_envs:RawTextEnv", "env"),
):
    register(name, entry, kind=kind, max_turns=3, datasets={"test": DATA, "train": DATA})
register("test/coin1-v1", "eval_envs:CoinEnv", kind="env", max_turns=1, datasets={"test": DATA, "train": DATA})
