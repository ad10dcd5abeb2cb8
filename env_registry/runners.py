"""Turn a registered env ID into the runner that drives it (what the trainer and evaluators call)."""

from __future__ import annotations

from typing import Any

from env_registry.registry import registry
from molt_envs import ChatAgentRunner, Runner, StepEnvRunner


def runner_for(env_id: str, **kwargs: Any) -> Runner:
    """A runner making a fresh env per episode, stamping the env ID and spec hash on every trajectory."""
    spec = registry.spec(env_id)
    cls = registry.load(env_id)
    merged = {**spec.kwargs, **kwargs}
    stamped = spec.model_copy(update={"kwargs": merged}) if kwargs else spec

    def factory() -> Any:
        instance = cls(**merged)
        instance.spec = stamped
        return instance

    if spec.kind == "chat_agent":
        return ChatAgentRunner(factory, env_id=spec.id, spec_hash=stamped.hash)
    return StepEnvRunner(factory, env_id=spec.id, spec_hash=stamped.hash, max_turns=spec.max_turns)


__all__ = ["runner_for"]
