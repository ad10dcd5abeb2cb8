"""``molt/arith-v1``: procedurally generated integer arithmetic a small transformer can learn from scratch.

Each task is ``"a+b="`` or ``"a-b="`` (operands 0..max_operand, subtraction kept non-negative). The held-out
``test`` split is a fixed, disjoint slice of the task space (chosen by a hash of the task), so test tasks are never
trained on. The reference completion is the bare answer, which is what the exact-match grader wants.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Iterator

from molt_envs.contract import Env, Result, StepState

_SPECIAL = re.compile(r"<\|[^|]*\|>")
_INTEGER = re.compile(r"-?\d+")


def is_test_task(question: str, test_fraction: float) -> bool:
    digest = hashlib.sha256(question.encode()).digest()
    return int.from_bytes(digest[:4], "big") / 2**32 < test_fraction


def generate_split(
    split: str, size: int = 4096, seed: int = 0, max_operand: int = 99, ops: str = "+-", test_fraction: float = 0.1
) -> Iterator[dict]:
    """Rows ``{"question", "answer"}``; train and test never share a question."""
    if split not in ("train", "test"):
        raise ValueError(f"arith has splits 'train' and 'test', not {split!r}")
    rng = random.Random(f"{seed}:{split}")
    want_test = split == "test"
    produced = 0
    while produced < size:
        a, b, op = rng.randint(0, max_operand), rng.randint(0, max_operand), rng.choice(ops)
        if op == "-" and b > a:
            a, b = b, a
        question = f"{a}{op}{b}="
        if is_test_task(question, test_fraction) != want_test:
            continue
        produced += 1
        yield {"question": question, "answer": str(a + b if op == "+" else a - b)}


def parse_answer(text: str) -> int | None:
    """The first integer the model wrote (special tokens stripped), or None."""
    match = _INTEGER.search(_SPECIAL.sub(" ", text))
    return int(match.group()) if match else None


class ArithEnv(Env):
    async def step(self, state: StepState) -> Result:
        answer = parse_answer(state["action_text"])
        exact = float(answer is not None and answer == int(state["label"]))
        return Result(reward=exact, terminated=True, info={"exact": exact, "missing_answer": float(answer is None)})
