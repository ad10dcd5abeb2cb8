"""``molt/sort-v1``: sort a short string of digits, with partial credit; what ``make demo`` learns.

Each task is ``"sort:74359="`` (3 to 6 digits) and its answer the digits in ascending order, ``"34579"``. The reward
is the fraction of answer positions the model got right (over the longer of its answer and the right one), so a
model that already writes the format earns something on every prompt and a group of samples usually differs in
reward: what a group estimator learns from. The score is exact match; the reward is 1.0 only for an exact match, so
evaluation's ``pass@1`` (a sample passes at the top of the reward range) is exact-match accuracy. The ``test`` split is a fixed slice of the task space chosen by a hash of
the task, so no test task is ever trained on.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Iterator

from molt_envs.contract import Env, Result, StepState

_SPECIAL = re.compile(r"<\|[^|]*\|>")


def is_test_task(question: str, test_fraction: float) -> bool:
    digest = hashlib.sha256(question.encode()).digest()
    return int.from_bytes(digest[:4], "big") / 2**32 < test_fraction


def generate_split(
    split: str, size: int = 4096, seed: int = 0, min_digits: int = 3, max_digits: int = 6, test_fraction: float = 0.1
) -> Iterator[dict]:
    """Rows ``{"question", "answer"}``; train and test never share a question.

    Args:
        split: ``"train"`` or ``"test"``.
        size: rows to yield (tasks may repeat within a split).
        seed: seed of the row order (the train/test partition of the task space does not depend on it).
        min_digits: shortest string to sort.
        max_digits: longest string to sort.
        test_fraction: share of the task space held out as ``test``.

    Raises:
        ValueError: for an unknown split or an empty digit range.
    """
    if split not in ("train", "test"):
        raise ValueError(f"sort has splits 'train' and 'test', not {split!r}")
    if not 1 <= min_digits <= max_digits:
        raise ValueError(f"need 1 <= min_digits <= max_digits, got {min_digits} and {max_digits}")
    rng = random.Random(f"{seed}:{split}")
    want_test = split == "test"
    produced = 0
    while produced < size:
        digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(min_digits, max_digits)))
        question = f"sort:{digits}="
        if is_test_task(question, test_fraction) != want_test:
            continue
        produced += 1
        yield {"question": question, "answer": "".join(sorted(digits))}


def answer_text(action_text: str) -> str:
    """What the model answered: its text without special tokens and surrounding whitespace."""
    return _SPECIAL.sub("", action_text).strip()


def partial_credit(answer: str, target: str) -> float:
    """Positions where ``answer`` matches ``target``, over the longer of the two (1.0 only for an exact match)."""
    if not answer and not target:
        return 1.0
    return sum(a == b for a, b in zip(answer, target, strict=False)) / max(len(answer), len(target))


class SortEnv(Env):
    """Single turn: reward = partial credit, score = exact match."""

    async def step(self, state: StepState) -> Result:
        answer, target = answer_text(state["action_text"]), str(state["label"])
        exact = float(answer == target)
        return Result(reward=partial_credit(answer, target), score=exact, terminated=True, info={"exact": exact})
