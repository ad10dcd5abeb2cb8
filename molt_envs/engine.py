"""The ``Engine`` protocol: the one door runners and the session server generate through.

Token ids in, token ids out. An engine returns, for each generated token, the log-probability of that token under
the temperature-scaled distribution the trainer recomputes (``log_softmax(logits / temperature)``), so rollout and
training log-probs are comparable token by token. Implementations: ``molt_train.engines.hf`` (transformers, the
embedded default) and ``molt_train.engines.vllm`` (GPU).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from molt_envs.contract import SamplingParams


@dataclass
class Generation:
    token_ids: list[int]
    log_probs: list[float]  # 1:1 with token_ids
    finish_reason: str  # "stop" (a stop token was sampled) or "length" (max_tokens reached)
    extra: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Engine(Protocol):
    async def generate(
        self, prompt_ids: list[int], params: SamplingParams, images: list[Any] | None = None
    ) -> Generation:
        """Generate a continuation of ``prompt_ids`` (the exact accumulated context)."""
        ...
