"""reasoning-gym: every one of its datasets as ``rg:NAME`` (``rg:countdown``, ``rg:needle_haystack``, ...).

``rg:NAME?field=value&...`` sets fields of the dataset's reasoning-gym config (``rg:countdown?min_numbers=3``);
``difficulty=k`` picks its curriculum level, ``grader_timeout_s`` bounds the scorer, ``system_prompt`` names one of
reasoning-gym's system prompts (``direct``, ...; ``null``: none). Each is checked against the config's own fields and
its ``validate()`` (or reasoning-gym's prompt names) when the ID is resolved, so a bad one fails naming the key. The env is
``molt_envs.envs.reasoning_gym``'s (single turn, scored by the dataset's ``score_answer``), with the same held-out
rule as the curated ``rg/...-v1`` IDs, which stay as aliases; it runs in an env server of its own process.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from env_registry.ecosystems.adapter import Adapter
from env_registry.sources import CatalogEntry

ENTRY_POINT = "molt_envs.envs.reasoning_gym:ReasoningGymEnv"
GENERATOR = "molt_envs.envs.reasoning_gym:generate_split"
ENV_KWARGS = ("difficulty", "grader_timeout_s", "system_prompt")  # the env's own; every other kwarg is a config field
SPLITS = {"train": {"size": 1000, "seed": 0}, "test": {"size": 200, "seed": 1_000_000}}
NEEDS_CONFIG = {"composite": "mixes other datasets: give them in its config (datasets=...)"}


class ReasoningGym(Adapter):
    scheme = "rg"
    library = "reasoning-gym"
    module = "reasoning_gym"
    extra = "reasoning-gym"
    license = "Apache-2.0"

    def names(self) -> list[str]:
        self.version()
        from reasoning_gym.factory import DATASETS

        return sorted(DATASETS)

    def catalog(self) -> list[CatalogEntry]:
        from reasoning_gym.factory import DATASETS

        entries = []
        for name in self.names():
            doc = (DATASETS[name][0].__doc__ or "").strip().splitlines()
            reason = NEEDS_CONFIG.get(name, "")
            entries.append(CatalogEntry(f"rg:{name}", "env", not reason, reason, doc[0] if doc else ""))
        return entries

    def build(self, name: str, kwargs: dict[str, Any]) -> dict[str, Any]:
        from reasoning_gym.factory import DATASETS

        config_cls = DATASETS[name][1]
        fields = {f.name: f for f in dataclasses.fields(config_cls)} if dataclasses.is_dataclass(config_cls) else {}
        env = {k: v for k, v in kwargs.items() if k in ENV_KWARGS}
        if "system_prompt" in env:
            from reasoning_gym.utils import SYSTEM_PROMPTS

            if env["system_prompt"] is not None and env["system_prompt"] not in SYSTEM_PROMPTS:
                raise ValueError(
                    f"system_prompt {env['system_prompt']!r} is not one of reasoning-gym's: "
                    f"{', '.join(sorted(SYSTEM_PROMPTS))} (or null)"
                )
        config = {k: v for k, v in kwargs.items() if k not in ENV_KWARGS}
        for key in config:
            if key not in fields or key in ("seed", "size"):
                settable = sorted(set(fields) - {"seed", "size"})
                raise ValueError(
                    f"reasoning-gym's {name} config has no field {key!r} to set; its fields: "
                    f"{', '.join(settable)} (and {', '.join(ENV_KWARGS)})"
                )
        from molt_envs.envs.reasoning_gym import config_values  # imports reasoning-gym: not at registration

        try:
            config_cls(**config_values(name, config)).validate()
        except (AssertionError, TypeError, ValueError) as exc:
            types = ", ".join(f"{k}: {getattr(fields[k].type, '__name__', fields[k].type)}" for k in config)
            raise ValueError(f"config {config} does not fit reasoning-gym's {name} ({types}): {exc}") from None
        env_kwargs = {"task": name, **env, **({"config": config} if config else {})}
        doc = (DATASETS[name][0].__doc__ or name).strip().splitlines()[0]
        return {
            "entry_point": ENTRY_POINT,
            "kind": "env",
            "description": f"reasoning-gym {name}: {doc}. Answer in <answer></answer>; scored by reasoning-gym.",
            "tags": ["reasoning-gym", "single-turn", "procedural", "text"],
            "license": self.license,
            "max_turns": 1,
            "kwargs": env_kwargs,
            "datasets": {
                split: {
                    "generator": GENERATOR,
                    "kwargs": dict(size_seed),
                    "env_kwargs": True,
                    "reference_key": "reference",
                }
                for split, size_seed in SPLITS.items()
            },
        }


SOURCE = ReasoningGym()
