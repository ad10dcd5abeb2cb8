"""The built-in agent of on-policy distillation: one on-policy completion per prompt, reward 0.0.

``--algo.advantage.estimator on_policy_distill`` without ``--env`` or ``--train.agent_path`` uses it: the advantage
is the per-token reverse KL to the teacher, so the agent only has to sample; the estimator ignores its reward.
"""

from __future__ import annotations

from molt_envs import Env, Result, StepEnvRunner, StepState

DISTILL_ENV_ID = "molt/distill"


class DistillEnv(Env):
    """Single turn: whatever the policy wrote ends the episode with reward 0.0 (no grading)."""

    async def step(self, state: StepState) -> Result:
        return Result(reward=0.0, terminated=True)


class AgentRunner(StepEnvRunner):
    """``StepEnvRunner`` over ``DistillEnv``."""

    def __init__(self) -> None:
        super().__init__(DistillEnv, env_id=DISTILL_ENV_ID)
