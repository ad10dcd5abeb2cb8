"""``molt/python-tool-v1``: multi-turn arithmetic with a sandboxed ``python_executor`` tool.

The model may answer directly or emit ``<tool_call>{"name": "python_executor", "arguments": {"code": ...}}
</tool_call>``; the env runs the code in a sandbox and feeds the output back as a ``<tool_response>`` user turn in
the model's chat template (a ``tool`` message). The episode ends when the model gives a final answer (``\\boxed{}``) or stops calling the
tool; only the final answer is graded.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

from molt_envs.contract import Env, Result, StepState
from molt_envs.graders.math import grade
from molt_envs.tool_calls import parse_tool_calls
from molt_envs.tools import PYTHON_EXECUTOR, ToolBox

SYSTEM_PROMPT = (
    "You are a careful calculator. Use the python_executor tool to compute exact results, then give the "
    "final answer as \\boxed{number}."
)


def generate_split(split: str, size: int = 1000, seed: int = 0) -> Iterator[dict[str, Any]]:
    """Arithmetic that is tedious by hand and trivial in Python; the test split uses a different seed stream."""
    rng = random.Random(f"python-tool:{seed}:{split}")
    for _ in range(size):
        a, b, c = rng.randint(100, 999), rng.randint(100, 999), rng.randint(10, 99)
        question = f"What is {a} * {b} - {c}?"
        yield {"question": question, "answer": str(a * b - c), "reference": f"\\boxed{{{a * b - c}}}"}


class PythonToolEnv(Env):
    system_prompt = SYSTEM_PROMPT  # put before a prompt that has no system message

    def __init__(
        self, provider: str = "auto", persistent: bool = False, max_output_chars: int = 1024, wall_s: float = 5.0
    ) -> None:
        self.tools = ToolBox(provider, persistent=persistent, max_chars=max_output_chars, wall_s=wall_s)
        self.tool_calls = 0

    async def reset(self, state: dict[str, Any]) -> dict[str, Any]:
        prompt = state["observation"]
        if isinstance(prompt, str):
            prompt = [{"role": "user", "content": prompt}]
        if prompt[0]["role"] != "system":
            prompt = [{"role": "system", "content": self.system_prompt}, *prompt]
        return {**state, "observation": prompt, "tools": [PYTHON_EXECUTOR]}

    async def step(self, state: StepState) -> Result:
        content, calls = parse_tool_calls(state["action_text"])
        if not calls or "\\boxed" in content:
            scores = grade(content, state["label"])
            return Result(
                reward=scores["reward"],
                terminated=True,
                info={
                    "correct": scores["math_exact"],
                    "tool_calls": float(self.tool_calls),
                    "turns": float(state["turn"] + 1),
                },
            )
        outputs = []
        for call in calls:
            self.tool_calls += 1
            outputs.append(await self.tools.call(call.name, call.arguments))
        return Result(reward=0.0, terminated=False, observation=[{"role": "tool", "content": out} for out in outputs])

    async def close(self) -> None:
        await self.tools.close()
