"""``molt/judge-summary-v1``: summarize a short generated report in one sentence; an LLM judge scores the summary
against a rubric, and its score is the reward.

The env grades through the run's judge (``StepState["judge"]``, a ``molt_envs.judge.JudgeClient``): during training
``molt-train rl --judge.model_name_or_path DIR`` (a frozen judge) or ``--judge.policy`` (the policy judges itself).
The judge is asked for one digit, 0 (wrong or empty) to 9 (every key fact, one sentence); the reward is the digit
/ 9. A run without a judge, a failed judge call or a reply with no digit ends the episode as ``failure_judge``
(counted), never as a silent reward 0.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator

from molt_envs.contract import Env, Result, StepState
from molt_envs.judge import JudgeError

RUBRIC = (
    "You grade one-sentence summaries of short reports. A good summary states who did what, where, and how many, "
    "in one sentence, and adds nothing the report does not say. Reply with a single digit: 0 (wrong, empty or "
    "unrelated) to 9 (every key fact, one sentence)."
)
_SPECIAL = re.compile(r"<\|[^|]*\|>")
_DIGIT = re.compile(r"\d")

_WHO = ["The harbour crew", "A school choir", "The night shift", "Two volunteers", "The city council", "A farm team"]
_WHAT = ["repaired", "painted", "counted", "delivered", "planted", "inspected"]
_THING = ["boats", "benches", "crates", "trees", "bridges", "lamps"]
_WHERE = ["in Oslo", "near the river", "at the market", "in the old town", "by the station", "on the hill"]
_WHEN = ["on Monday", "before dawn", "last week", "during the storm", "in spring", "after the festival"]


def generate_split(split: str, size: int = 1000, seed: int = 0) -> Iterator[dict]:
    """Rows ``{"report", "summary"}``: a three-sentence report and a reference one-sentence summary; the train and
    test splits draw from different seeds."""
    if split not in ("train", "test"):
        raise ValueError(f"judge-summary has splits 'train' and 'test', not {split!r}")
    rng = random.Random(f"{seed}:{split}")
    for _ in range(size):
        who, what, thing = rng.choice(_WHO), rng.choice(_WHAT), rng.choice(_THING)
        where, when, count = rng.choice(_WHERE), rng.choice(_WHEN), rng.randint(2, 40)
        report = (
            f"{who} {what} {count} {thing} {where} {when}. The work took most of the day. "
            f"Nobody was hurt, and the {thing} are in use again."
        )
        yield {"report": report, "summary": f"{who} {what} {count} {thing} {where} {when}."}


def parse_score(reply: str) -> int | None:
    """The first digit of the judge's reply (special tokens stripped), or None."""
    match = _DIGIT.search(_SPECIAL.sub(" ", reply))
    return int(match.group()) if match else None


class JudgeSummaryEnv(Env):
    """One turn: the model summarizes ``label`` (the report); the judge's rubric digit / 9 is the reward."""

    async def step(self, state: StepState) -> Result:
        judge = state.get("judge")
        if judge is None:
            raise JudgeError(
                "molt/judge-summary-v1 is graded by an LLM judge and this run has none: pass "
                "--judge.model_name_or_path DIR (a frozen judge) or --judge.policy to molt-train rl"
            )
        summary = _SPECIAL.sub("", state["action_text"]).strip()
        reply = await judge.complete(
            [
                {"role": "system", "content": RUBRIC},
                {"role": "user", "content": f"Report:\n{state['label']}\n\nSummary:\n{summary}\n\nScore:"},
            ]
        )
        score = parse_score(reply)
        if score is None:
            raise JudgeError(f"the judge's reply {reply[:80]!r} holds no 0-9 score")
        return Result(reward=score / 9, terminated=True, info={"judge_score": float(score)})
