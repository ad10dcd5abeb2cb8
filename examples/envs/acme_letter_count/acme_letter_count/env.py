"""``acme/letter-count-v1``: the model counts a letter in a word and puts the count in ``\\boxed{}``.

Reward 1.0 for the exact count in the last ``\\boxed{}``, else 0.0; ``info`` says whether any boxed answer was given.
"""

from __future__ import annotations

import re
from typing import Any

from molt_envs.contract import Env, Result, StepState

_BOXED = re.compile(r"\\boxed\{\s*([^{}]*?)\s*\}")


def grade(response: str, label: Any) -> dict[str, Any]:
    """``{"reward", "answered", "exact"}`` for one response against the true count."""
    answers = _BOXED.findall(response)
    if not answers:
        return {"reward": 0.0, "answered": False, "exact": False}
    try:
        exact = int(answers[-1]) == int(label)
    except ValueError:
        exact = False
    return {"reward": 1.0 if exact else 0.0, "answered": True, "exact": exact}


class LetterCountEnv(Env):
    async def step(self, state: StepState) -> Result:
        scores = grade(state["action_text"], state["label"])
        return Result(
            reward=scores["reward"], terminated=True, info={"answered": scores["answered"], "exact": scores["exact"]}
        )
