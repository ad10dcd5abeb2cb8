"""A single-turn agent whose reward is the parity of the completion's length (an untrained model gets both)."""

from molt_envs import Env, Result, StepEnvRunner


class ParityEnv(Env):
    async def step(self, state):
        return Result(reward=float(len(state["action_text"]) % 2), terminated=True)


class AgentRunner(StepEnvRunner):
    def __init__(self):
        super().__init__(ParityEnv, env_id="test/parity")
