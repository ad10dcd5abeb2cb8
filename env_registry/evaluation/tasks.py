"""The envs an eval runs (``EnvTask``: spec, factory, the split's first N rows, weight) and the settings it runs with."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from env_registry.datasets import load_split
from env_registry.errors import Error
from env_registry.manifest import EnvSpec
from env_registry.mix import MixEntry
from env_registry.registry import registry
from molt_envs import SamplingParams


@dataclass
class EnvTask:
    """One env of an eval. ``env_id`` is the spec's ID (the key of its samples and of its summary)."""

    env_id: str
    spec: EnvSpec
    factory: Callable[[], Any]
    rows: list[dict[str, Any]]
    weight: float = 1.0
    given_id: str = ""  # as the user wrote it (module prefix, pin or URL kept)


@dataclass
class EvalSettings:
    """How an eval samples. ``temperature`` None: 0 (greedy) when ``n`` is 1, else 1.0."""

    split: str = "test"
    max_samples: int | None = None
    n: int = 1
    ks: list[int] | None = None
    temperature: float | None = None
    top_p: float = 1.0
    max_new_tokens: int = 256
    seed: int = 0
    concurrency: int = 16
    timeout_s: float = 600.0
    pass_threshold: float | None = None  # None: the top of each env's reward_range
    extra: dict[str, Any] = field(default_factory=dict)  # recorded in the summary as is

    def __post_init__(self) -> None:
        if self.temperature is None:
            self.temperature = 0.0 if self.n == 1 else 1.0
        for name, low in (("n", 1), ("concurrency", 1), ("max_new_tokens", 1)):
            value = getattr(self, name)
            if not isinstance(value, int) or value < low:
                raise Error(f"{_flag(name)} must be an integer >= {low}, got {value!r}")
        if self.max_samples is not None and self.max_samples < 1:
            raise Error(f"--max-samples must be >= 1, got {self.max_samples}")
        if not (self.timeout_s > 0 and math.isfinite(self.timeout_s)):
            raise Error(f"--timeout must be a positive number of seconds, got {self.timeout_s}")
        try:
            self.base_params()
        except ValueError as exc:
            raise Error(f"bad sampling flags: {exc}") from None

    def base_params(self) -> SamplingParams:
        return SamplingParams(temperature=self.temperature, top_p=self.top_p, max_tokens=self.max_new_tokens)

    def sampling(self) -> dict[str, Any]:
        """What fixes a sample's content; a resumed eval must match it."""
        return {
            "split": self.split,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_new_tokens": self.max_new_tokens,
            "seed": self.seed,
        }

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _flag(name: str) -> str:
    return {"n": "-n"}.get(name, "--" + name.replace("_", "-"))


def sample_seed(seed: int, env_id: str, prompt_id: int, sample: int) -> int:
    """The seed of one sample: stable across runs and resumes, distinct per (env, prompt, sample)."""
    digest = hashlib.sha256(f"{seed}:{env_id}:{prompt_id}:{sample}".encode()).digest()
    return int.from_bytes(digest[:4], "big") >> 1


def load_tasks(entries: Sequence[MixEntry], split: str, max_samples: int | None) -> list[EnvTask]:
    """Resolve each env of a mix and read the first ``max_samples`` rows of its ``split``.

    Raises:
        Error: an unknown ID, a missing split, or a split with no rows, naming the env.
    """
    tasks = []
    for entry in entries:
        spec, factory = registry.factory(entry.env_id)
        try:
            rows = load_split(spec, split, max_samples)
        except Error as exc:
            raise Error(f"--env {entry.env_id}: {exc}") from None
        if not rows:
            raise Error(f"--env {entry.env_id}: split {split!r} has no rows")
        tasks.append(EnvTask(spec.id, spec, factory, rows, entry.weight, entry.env_id))
    ids = [t.env_id for t in tasks]
    if len(set(ids)) != len(ids):
        raise Error(f"the --env values name the same env more than once: {ids}")
    return tasks


def pass_threshold(task: EnvTask, settings: EvalSettings) -> float:
    """A sample passes when its reward reaches this (default: the top of the env's reward_range)."""
    return settings.pass_threshold if settings.pass_threshold is not None else task.spec.reward_range[1]
