"""Turn a registered env ID into the runner that drives it (what the trainer and evaluators call)."""

from __future__ import annotations

from typing import Any

from env_registry.registry import registry
from molt_envs import ChatAgentRunner, Runner, StepEnvRunner
from molt_envs.seats import SeatRunner


def runner_for(env_id: str, **kwargs: Any) -> Runner:
    """A runner making a fresh env per episode, stamping the env ID and spec hash on every trajectory.

    A ``game`` gets a ``SeatRunner`` (one trajectory per model seat), a ``chat_agent`` a ``ChatAgentRunner``, an
    ``env`` a ``StepEnvRunner``. ``kwargs`` overlay the spec's (e.g. ``mode="vs", opponent="random"``).
    """
    spec, factory = registry.factory(env_id, **kwargs)
    if spec.kind == "chat_agent":
        return ChatAgentRunner(factory, env_id=spec.id, spec_hash=spec.hash)
    if spec.kind == "game":
        return SeatRunner(factory, env_id=spec.id, spec_hash=spec.hash, max_turns=spec.max_turns)
    return StepEnvRunner(factory, env_id=spec.id, spec_hash=spec.hash, max_turns=spec.max_turns)
