"""An arith agent of the cluster test whose every episode reaches the run's env server and the sandbox ``ray``
provider: its answer is graded by ``test/served-arith-v1`` (an isolated install; ``env_registry.make`` reaches the
env server of this rollout worker's node, owned by an ``EnvServerActor``), and its expected answer is computed in a
sandbox (``print(a+b)`` for the question ``a+b=``) and checked against the served env's label. A sandbox that failed
(its node lost) ends the episode as ``failure_sandbox``, never as reward 0."""

import re

import env_registry
from molt_envs import Env, Result, StepEnvRunner
from molt_envs.tools import ToolBox

SERVED = "test/served-arith-v1"
QUESTION = re.compile(r"(\d+[+-]\d+)=")


class ServedSandboxedArithEnv(Env):
    async def reset(self, state):
        self.served = env_registry.make(SERVED)  # a client of the server on this node; one WebSocket per episode
        self.label = state["label"]
        state = await self.served.reset(state)
        prompt = state["observation"]
        self.expression = QUESTION.search(prompt if isinstance(prompt, str) else prompt[-1]["content"]).group(1)
        return state

    async def step(self, state):
        async with ToolBox("ray", wall_s=30) as tools:
            expected = int(await tools.python_executor(f"print({self.expression})"))
        if expected != int(self.label):
            raise ValueError(f"the sandbox computed {self.expression} = {expected}, the env's label is {self.label}")
        graded = await self.served.step(state)
        return Result(reward=graded.reward, terminated=True, info={**graded.info, "expected": float(expected)})

    async def close(self):
        if hasattr(self, "served"):
            await self.served.close()


class AgentRunner(StepEnvRunner):
    def __init__(self):
        super().__init__(ServedSandboxedArithEnv, env_id=SERVED)
