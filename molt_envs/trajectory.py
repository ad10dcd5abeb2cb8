"""``Trajectory``: the token-first record a rollout hands to the trainer.

Invariants: ``log_probs`` is 1:1 with ``token_ids`` (0.0 outside actions); every ``(start, end)`` in
``action_ranges`` is a half-open span of tokens the model generated; nothing is ever re-tokenized. A vision model's
trajectory holds its context's ``images`` in placeholder order and ``mm_inputs``, the processor's tensors for them,
aligned with the image placeholders in ``token_ids``: what the trainer's forward consumes, never re-processed.

A runner may return several trajectories for one episode: the *segments* of one chat rollout (one ``rollout_id``,
one reward) or the *seats* of one game (``seat`` set, a ``rollout_id`` and a reward each).
"""

from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from molt_envs.vision import VisionInputs


@dataclass
class Trajectory:
    """One rollout (or one segment of a chat rollout), token-exact.

    Attributes:
        token_ids: the whole context, prompt included. log_probs: 1:1 with ``token_ids`` (0.0 outside actions).
        action_ranges: half-open spans of ``token_ids`` the model generated (trained on); ``finish_reasons``: one
            per span.
        reward, score, truncated, info, images: the episode's outcome and context.
        group_id: the samples of one prompt share it. rollout_id: the segments of one rollout share it.
        env_id, spec_hash: the env and the exact spec it came from.
        failure: why the episode failed (None when it completed).
        prompt, label, prompt_len, num_turns: what it started from and how far it went.
    """

    token_ids: list[int] = field(default_factory=list)
    action_ranges: list[tuple[int, int]] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    reward: float = 0.0
    score: float | None = None
    truncated: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    images: list[Any] = field(default_factory=list)
    group_id: str = ""
    rollout_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    env_id: str | None = None
    spec_hash: str | None = None
    failure: str | None = None  # why the episode failed; None when it completed
    prompt: Any = None
    label: Any = None
    prompt_len: int = 0  # tokens before the first action
    finish_reasons: list[str] = field(default_factory=list)  # one per action range
    num_turns: int = 0
    seat: str | None = None  # the seat of a multi-seat game this is (molt_envs.seats); None for one-seat episodes
    mm_inputs: VisionInputs | None = None  # the images' tensors (vision models), aligned with their placeholders

    def append_action(self, token_ids: list[int], log_probs: list[float], finish_reason: str = "stop") -> None:
        """Append tokens the model generated, as a new action range.

        Raises:
            ValueError: if ``token_ids`` and ``log_probs`` differ in length.
        """
        if len(token_ids) != len(log_probs):
            raise ValueError(f"action has {len(token_ids)} tokens but {len(log_probs)} log-probs; they must align 1:1")
        start = len(self.token_ids)
        self.token_ids.extend(token_ids)
        self.log_probs.extend(float(x) for x in log_probs)
        self.action_ranges.append((start, len(self.token_ids)))
        self.finish_reasons.append(finish_reason)

    def append_observation(self, token_ids: list[int]) -> None:
        """Context the model did not generate (prompt, env feedback, tool output): masked, log-prob 0."""
        self.token_ids.extend(token_ids)
        self.log_probs.extend([0.0] * len(token_ids))

    def action_mask(self) -> list[bool]:
        """One bool per token: True inside an action range."""
        mask = [False] * len(self.token_ids)
        for start, end in self.action_ranges:
            mask[start:end] = [True] * (end - start)
        return mask

    @property
    def num_action_tokens(self) -> int:
        """How many tokens the model generated."""
        return sum(end - start for start, end in self.action_ranges)

    @property
    def ok(self) -> bool:
        """Whether the episode completed (no ``failure``)."""
        return self.failure is None

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form (images and their tensors are left out: they are not JSON)."""
        data = asdict(replace(self, images=[], mm_inputs=None))
        data["action_ranges"] = [list(r) for r in self.action_ranges]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Trajectory:
        """The inverse of ``to_dict``.

        Raises:
            TypeError: for a key that is not a field.
        """
        data = dict(data)
        data["action_ranges"] = [tuple(r) for r in data.get("action_ranges", [])]
        return cls(**data)
