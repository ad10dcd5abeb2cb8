"""``rg/<task>-v1``: procedural tasks of the ``reasoning-gym`` package, graded by reasoning-gym's own scorers.

One env class and one generator serve every task; the manifest names the task (``kwargs.task``). Difficulty knobs
are env kwargs, recorded in the spec hash, and the splits follow them (``env_kwargs = true``):

- ``difficulty=k``: reasoning-gym's curriculum for the task at global level ``k`` (0 = its easiest; levels past a
  knob's last one stay at that one);
- ``config={...}``: fields of the task's reasoning-gym config (e.g. ``{"max_numbers": 4}`` for countdown), applied
  over the level's;
- ``system_prompt``: which of reasoning-gym's ``SYSTEM_PROMPTS`` opens each prompt (``"default"``; ``"direct"`` is a
  sentence), or ``None`` for none (a prompt of the question alone: what a small model trained from scratch can afford).

Held-out rule: item ``i`` of a split is reasoning-gym's item for generator seed ``seed + i``, and the train and test
splits' seed ranges do not overlap. Each prompt is reasoning-gym's default system prompt and the question; the
answer goes in ``<answer>...</answer>``; the scorer runs in a thread under ``grader_timeout_s`` (a timeout is a
counted ``grader_timeout`` with reward 0).
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Iterator
from typing import Any

from molt_envs.bridges import clean_action
from molt_envs.contract import Env, Result, StepState


@functools.lru_cache(maxsize=64)
def _dataset(task: str, difficulty: int | None, config_json: str, seed: int, size: int) -> Any:
    import reasoning_gym
    from reasoning_gym.factory import DATASETS, create_curriculum, has_curriculum

    if task not in DATASETS:
        raise ValueError(f"reasoning-gym has no task {task!r}; its tasks: {', '.join(sorted(DATASETS))}")
    config: dict[str, Any] = {}
    if difficulty is not None:
        if not (isinstance(difficulty, int) and difficulty >= 0):
            raise ValueError(f"difficulty must be a curriculum level (an int >= 0), got {difficulty!r}")
        if not has_curriculum(task):
            raise ValueError(f"reasoning-gym task {task!r} has no curriculum; set its config=... fields instead")
        curriculum = create_curriculum(task)
        curriculum.set_global_level(difficulty)
        config = vars(curriculum.generate_configuration({"seed": seed, "size": size}))
    config.update(config_values(task, json.loads(config_json)))
    config.update(seed=seed, size=size)
    try:
        return reasoning_gym.create_dataset(task, **config)
    except TypeError as exc:
        raise ValueError(f"config {json.loads(config_json)} does not fit reasoning-gym task {task!r}: {exc}") from None


def config_values(task: str, config: dict[str, Any]) -> dict[str, Any]:
    """``config`` (JSON values) with each string of a field typed as an enum, or a list of one, made that enum
    (``aiw``'s ``task_types=["siblings"]``: reasoning-gym compares members, so a bare string would not do).

    Raises:
        ValueError: a value that is none of the enum's, naming the field and the values it takes.
    """
    import enum
    import typing

    from reasoning_gym.factory import DATASETS

    config_cls = DATASETS[task][1]
    try:
        hints = typing.get_type_hints(config_cls)
    except Exception:  # an annotation that does not resolve: leave the values as they are
        return dict(config)
    out = {}
    for key, value in config.items():
        hint = hints.get(key)
        kind = next(
            (t for t in (hint, *typing.get_args(hint)) if isinstance(t, type) and issubclass(t, enum.Enum)), None
        )
        if kind is not None and isinstance(value, str | list):
            try:
                value = [kind(v) for v in value] if isinstance(value, list) else kind(value)
            except ValueError:
                allowed = ", ".join(repr(m.value) for m in kind)
                raise ValueError(f"{key}={value!r}: each must be one of {allowed}") from None
        out[key] = value
    return out


def _config_json(config: dict[str, Any] | None) -> str:
    return json.dumps(config or {}, sort_keys=True)


def _system_prompt(name: str | None) -> str | None:
    from reasoning_gym.utils import SYSTEM_PROMPTS

    if name is not None and name not in SYSTEM_PROMPTS:
        raise ValueError(
            f"system_prompt {name!r} is not one of reasoning-gym's: {', '.join(sorted(SYSTEM_PROMPTS))} (or null)"
        )
    return None if name is None else SYSTEM_PROMPTS[name]


def reference_answer(entry: dict[str, Any]) -> str:
    """A completion reasoning-gym's scorer gives full marks: the answer, or the example of a many-answer task."""
    answer = entry["answer"]
    if answer is None:
        meta = entry["metadata"]
        answer = meta.get("example_answer", meta.get("possible_answer"))
    return f"<answer>{answer if isinstance(answer, str) else json.dumps(answer)}</answer>"


def generate_split(
    split: str,
    task: str,
    size: int,
    seed: int,
    difficulty: int | None = None,
    config: dict[str, Any] | None = None,
    system_prompt: str | None = "default",
    **env_only: Any,
) -> Iterator[dict[str, Any]]:
    """Rows ``{"prompt": [system, user], "label": entry, "reference": "<answer>...</answer>"}`` (no system message
    for ``system_prompt=None``).

    ``env_only`` are the env's kwargs the data does not depend on (``grader_timeout_s``).
    """
    system = _system_prompt(system_prompt)
    dataset = _dataset(task, difficulty, _config_json(config), seed, size)
    for i in range(size):
        entry = dataset[i]
        yield {
            "prompt": ([{"role": "system", "content": system}] if system is not None else [])
            + [{"role": "user", "content": entry["question"]}],
            "label": entry,
            "reference": reference_answer(entry),
        }


class ReasoningGymEnv(Env):
    """Single turn: the model's ``<answer>`` is scored by the task's ``score_answer`` (reward in [0, 1])."""

    def __init__(
        self,
        task: str,
        difficulty: int | None = None,
        config: dict[str, Any] | None = None,
        grader_timeout_s: float = 10.0,
        system_prompt: str | None = "default",  # the rows' (generate_split); checked here too
    ) -> None:
        self.scorer = _dataset(task, difficulty, _config_json(config), 0, 1)  # raises here for a bad task/knob
        _system_prompt(system_prompt)
        self.grader_timeout_s = grader_timeout_s

    async def step(self, state: StepState) -> Result:
        from reasoning_gym.utils import extract_answer

        answer = extract_answer(clean_action(state["action_text"]))
        timed_out = False
        try:
            score = await asyncio.wait_for(
                asyncio.to_thread(self.scorer.score_answer, answer, state["label"]), timeout=self.grader_timeout_s
            )
        except TimeoutError:
            score, timed_out = 0.0, True
        score = float(score)
        return Result(
            reward=score,
            terminated=True,
            info={
                "correct": float(score == 1.0),
                "missing_answer": float(answer is None),
                "grader_timeout": float(timed_out),
            },
        )
