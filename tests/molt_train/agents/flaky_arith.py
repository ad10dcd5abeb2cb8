"""An arith agent whose grader raises in about 20% of episodes (chosen by the episode's sampling seed)."""

import random

from molt_envs import Env, StepEnvRunner
from molt_envs.envs.arith import ArithEnv

FAILURE_RATE = 0.2


class FlakyArithEnv(Env):
    async def step(self, state):
        if random.Random(state["sampling_params"].seed).random() < FAILURE_RATE:
            raise RuntimeError("injected grader failure")
        return await ArithEnv().step(state)


class AgentRunner(StepEnvRunner):
    def __init__(self):
        super().__init__(FlakyArithEnv, env_id="test/flaky-arith")
