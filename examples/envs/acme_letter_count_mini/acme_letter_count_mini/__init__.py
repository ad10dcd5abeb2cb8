"""``acme/letter-count-mini-v1``: reward 1.0 for the exact count of a letter in the last ``\\boxed{}``, else 0.0."""

from molt_envs import Env, Result
from molt_envs.graders.math import last_boxed


class LetterCountEnv(Env):
    async def step(self, state):
        answer = last_boxed(state["action_text"])
        return Result(reward=float(answer == state["label"]), info={"answered": answer is not None})
