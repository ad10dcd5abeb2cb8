"""An arith agent whose grader computes each episode's expected answer in a sandbox of the ``ray`` provider
(``print(a+b)`` for the question ``a+b=``), so every episode reaches the provider's actors, spread over the cluster.
A sandbox that failed (its node lost) ends the episode as ``failure_sandbox``, never as reward 0."""

import re

from molt_envs import Env, Result, StepEnvRunner
from molt_envs.envs.arith import parse_answer
from molt_envs.tools import ToolBox

QUESTION = re.compile(r"(\d+[+-]\d+)=")


class SandboxedArithEnv(Env):
    async def reset(self, state):
        prompt = state["observation"]
        text = prompt if isinstance(prompt, str) else prompt[-1]["content"]
        self.expression = QUESTION.search(text).group(1)
        return state

    async def step(self, state):
        async with ToolBox("ray", wall_s=30) as tools:
            expected = int(await tools.python_executor(f"print({self.expression})"))
        answer = parse_answer(state["action_text"])
        return Result(reward=float(answer == expected), terminated=True, info={"expected": float(expected)})


class AgentRunner(StepEnvRunner):
    def __init__(self):
        super().__init__(SandboxedArithEnv, env_id="test/sandboxed-arith")
