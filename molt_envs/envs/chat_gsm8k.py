"""``molt/chat-gsm8k-v1`` and ``molt/chat-gsm8k-anthropic-v1``: GSM8K as ChatAgents on a stock SDK, single turn.

The same task as ``molt/gsm8k-v1``, but the agent owns the loop: one call through ``openai.AsyncOpenAI`` (or
``anthropic.AsyncAnthropic``) pointed at the session URL, graded by the GSM8K grader. The session server captures
the tokens; the agent never sees them.
"""

from __future__ import annotations

import asyncio

from molt_envs.contract import ChatAgent, ChatContext, Result
from molt_envs.graders.math import grade

CLIENT_TIMEOUT_S = 3600.0  # generation can queue behind a whole batch; retries are safe (the server replays)


class _GradedAgent(ChatAgent):
    def __init__(self, grader_timeout_s: float = 5.0) -> None:
        self.grader_timeout_s = grader_timeout_s

    async def _graded(self, text: str, label: object) -> Result:
        scores = await asyncio.wait_for(asyncio.to_thread(grade, text, label), timeout=self.grader_timeout_s)
        return Result(
            reward=scores["reward"],
            info={"math_exact": scores["math_exact"], "missing_answer": scores["missing_answer"]},
        )


class ChatGSM8KAgent(_GradedAgent):
    """One OpenAI Chat Completions call."""

    async def run(self, ctx: ChatContext) -> Result:
        from openai import AsyncOpenAI

        async with AsyncOpenAI(base_url=ctx.base_url, api_key=ctx.api_key, timeout=CLIENT_TIMEOUT_S) as client:
            response = await client.chat.completions.create(
                model=ctx.model_name,
                messages=ctx.messages,
                max_tokens=ctx.sampling_params.max_tokens,
                temperature=ctx.sampling_params.temperature,
                top_p=ctx.sampling_params.top_p,
            )
        return await self._graded(response.choices[0].message.content or "", ctx.label)


class ChatGSM8KAnthropicAgent(_GradedAgent):
    """One Anthropic Messages call (system messages go in ``system``)."""

    async def run(self, ctx: ChatContext) -> Result:
        from anthropic import AsyncAnthropic

        system = "\n\n".join(m["content"] for m in ctx.messages if m["role"] == "system")
        messages = [m for m in ctx.messages if m["role"] != "system"]
        async with AsyncAnthropic(base_url=ctx.session_url, api_key=ctx.api_key, timeout=CLIENT_TIMEOUT_S) as client:
            message = await client.messages.create(
                model=ctx.model_name,
                messages=messages,
                max_tokens=ctx.sampling_params.max_tokens,
                **({"system": system} if system else {}),
            )  # temperature etc.: the session's SamplingParams
        text = "".join(block.text for block in message.content if block.type == "text")
        return await self._graded(text, ctx.label)
