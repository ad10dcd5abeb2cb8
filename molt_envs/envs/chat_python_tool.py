"""``molt/chat-python-tool-v1``: the ``molt/python-tool-v1`` task as a multi-turn ChatAgent with structured tool calls.

The agent owns the loop on a stock ``openai.AsyncOpenAI``: it offers the ``python_executor`` tool, runs every call
the model makes (the server parses the model's ``<tool_call>`` text into ``tool_calls``) in the sandbox, sends all
results back as ``tool`` messages in one request, and stops when the model answers without calling a tool (or with
a ``\\boxed{}`` answer) or at the turn cap. Only the final answer is graded.
"""

from __future__ import annotations

import asyncio

from molt_envs.contract import ChatAgent, ChatContext, Result
from molt_envs.envs.python_tool import SYSTEM_PROMPT
from molt_envs.graders.math import grade
from molt_envs.tools import PYTHON_EXECUTOR, ToolBox

CLIENT_TIMEOUT_S = 3600.0


class ChatPythonToolAgent(ChatAgent):
    system_prompt = SYSTEM_PROMPT  # put before a prompt that has no system message

    def __init__(
        self,
        provider: str = "auto",
        persistent: bool = False,
        max_output_chars: int = 1024,
        wall_s: float = 5.0,
        max_turns: int = 4,
        grader_timeout_s: float = 5.0,
    ) -> None:
        self.tools = ToolBox(provider, persistent=persistent, max_chars=max_output_chars, wall_s=wall_s)
        self.max_turns = max_turns
        self.grader_timeout_s = grader_timeout_s

    async def run(self, ctx: ChatContext) -> Result:
        from openai import AsyncOpenAI

        messages = self.first_messages(ctx)
        tools = ctx.tools or [PYTHON_EXECUTOR]
        async with (
            self.tools,
            AsyncOpenAI(base_url=ctx.base_url, api_key=ctx.api_key, timeout=CLIENT_TIMEOUT_S) as client,
        ):
            for turn in range(self.max_turns):
                response = await client.chat.completions.create(
                    model=ctx.model_name,
                    messages=messages,
                    tools=tools,
                    max_tokens=ctx.sampling_params.max_tokens,
                    temperature=ctx.sampling_params.temperature,
                )
                message = response.choices[0].message
                if not message.tool_calls or "\\boxed" in (message.content or ""):
                    return await self._graded(message.content or "", ctx.label, turn + 1)
                messages.append(message.model_dump(exclude_none=True))
                for call in message.tool_calls:  # all results go back in one request (one multi-message delta)
                    output = await self.tools.call(call.function.name, call.function.arguments)
                    messages.append({"role": "tool", "tool_call_id": call.id, "content": output})
        return Result(reward=0.0, truncated=True, info=self._info(0.0, self.max_turns))

    def first_messages(self, ctx: ChatContext) -> list[dict]:
        """The conversation's opening: the system prompt, then the row's messages."""
        messages = list(ctx.messages)
        if messages[0]["role"] != "system":
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return messages

    async def _graded(self, text: str, label: object, turns: int) -> Result:
        scores = await asyncio.wait_for(asyncio.to_thread(grade, text, label), timeout=self.grader_timeout_s)
        return Result(reward=scores["reward"], info=self._info(scores["math_exact"], turns))

    def _info(self, correct: float, turns: int) -> dict[str, float]:
        return {"correct": correct, "tool_calls": float(self.tools.calls), "turns": float(turns)}
