"""An arith agent whose rollouts come back as two segment Trajectories sharing one rollout_id and reward, the shape
a ChatAgent rollout takes after context compaction."""

from dataclasses import replace

from molt_envs import StepEnvRunner
from molt_envs.envs.arith import ArithEnv


class AgentRunner(StepEnvRunner):
    def __init__(self):
        super().__init__(ArithEnv, env_id="test/segmented-arith")

    async def execute(self, prompt, label, sampling_params, max_length, tokenizer, engine, images=None, tools=None):
        whole = await super().execute(prompt, label, sampling_params, max_length, tokenizer, engine, images, tools)
        if whole.failure is not None:
            return whole
        summary = replace(
            whole,
            token_ids=list(whole.token_ids),
            log_probs=list(whole.log_probs),
            action_ranges=list(whole.action_ranges),
        )
        return [whole, summary]
