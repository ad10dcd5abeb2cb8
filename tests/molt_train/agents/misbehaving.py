"""A runner that misbehaves by prompt: ``hang`` never finishes in time, ``raise`` raises out of execute (instead of
recording a failure), anything else is a normal arith episode."""

import asyncio

from molt_envs import StepEnvRunner
from molt_envs.envs.arith import ArithEnv


class AgentRunner(StepEnvRunner):
    def __init__(self):
        super().__init__(ArithEnv, env_id="test/misbehaving")

    async def execute(self, prompt, label, sampling_params, max_length, tokenizer, engine, images=None, tools=None):
        text = prompt[-1]["content"]
        if text == "hang":
            await asyncio.sleep(60)
        if text == "raise":
            raise RuntimeError("runner bug")
        return await super().execute(prompt, label, sampling_params, max_length, tokenizer, engine, images, tools)
