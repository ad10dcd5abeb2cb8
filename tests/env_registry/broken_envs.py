"""Broken envs the validation checks must catch, registered at import as ``broken/<flaw>-v1``."""

from __future__ import annotations

import random

from env_registry import register
from molt_envs import Env, Result, StepState


def rows(split: str, size: int = 4, shared: bool = False):
    for i in range(size):
        prefix = "q" if shared else split
        yield {"question": f"{prefix} {i}", "answer": str(i), "reference": str(i)}


def short_rows(split: str, size: int = 4):
    yield from rows(split, size - 1)  # one row fewer than the manifest declares


class OutOfRange(Env):
    async def step(self, state: StepState) -> Result:
        return Result(reward=2.0 if state["action_text"].startswith(state["label"]) else 0.0)


class CrashesOnEmpty(Env):
    async def step(self, state: StepState) -> Result:
        text = state["action_text"].replace("<|im_end|>", "")
        return Result(reward=float(int(text) == int(state["label"])))  # int("") raises


class Moody(Env):
    async def step(self, state: StepState) -> Result:
        return Result(reward=random.random())


def data(shared: bool = False) -> dict:
    split = {"generator": "broken_envs:rows", "kwargs": {"shared": shared}, "input_key": "question",
             "label_key": "answer", "reference_key": "reference"}  # fmt: skip
    return {"train": split, "test": split}


register("broken/out-of-range-v1", "broken_envs:OutOfRange", max_turns=1, datasets=data())
register("broken/crash-v1", "broken_envs:CrashesOnEmpty", max_turns=1, datasets=data())
register("broken/moody-v1", "broken_envs:Moody", max_turns=1, datasets=data(shared=True))
short = {"generator": "broken_envs:short_rows", "kwargs": {"size": 4}, "input_key": "question", "label_key": "answer"}
register("broken/short-v1", "broken_envs:OutOfRange", max_turns=1, datasets={"test": short})
