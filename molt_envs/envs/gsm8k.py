"""``molt/gsm8k-v1``: single-turn grade-school math, final answer in ``\\boxed{}``."""

from __future__ import annotations

import asyncio

from molt_envs.contract import Env, Result, StepState
from molt_envs.graders.math import grade


class GSM8KEnv(Env):
    def __init__(self, grader_timeout_s: float = 5.0) -> None:
        self.grader_timeout_s = grader_timeout_s

    async def step(self, state: StepState) -> Result:
        scores = await asyncio.wait_for(
            asyncio.to_thread(grade, state["action_text"], state["label"]), timeout=self.grader_timeout_s
        )
        return Result(
            reward=scores["reward"],
            terminated=True,
            info={"math_exact": scores["math_exact"], "missing_answer": scores["missing_answer"]},
        )
