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
    """One ``Engine.generate`` answer.

    Attributes:
        token_ids: the generated tokens. log_probs: 1:1 with ``token_ids``.
        finish_reason: "stop" (a stop token was sampled) or "length" (max_tokens reached).
        extra: engine-specific details (e.g. timings).
    """

    token_ids: list[int]
    log_probs: list[float]  # 1:1 with token_ids
    finish_reason: str  # "stop" (a stop token was sampled) or "length" (max_tokens reached)
    extra: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Engine(Protocol):
    """What runners and the session server generate through (``molt_train``'s hf and vLLM engines implement it)."""

    async def generate(
        self, prompt_ids: list[int], params: SamplingParams, images: list[Any] | None = None
    ) -> Generation:
        """Generate a continuation of ``prompt_ids`` (the exact accumulated context).

        Args:
            prompt_ids: the whole context so far, as token ids (never re-tokenized).
            params: the pinned sampling parameters.
            images: the context's images, for a vision model.

        Returns:
            The ``Generation``, with the log-prob of each token under ``log_softmax(logits / temperature)``.

        Raises:
            ValueError: for an empty prompt or one that leaves no room for ``params.max_tokens``.
        """
        ...
