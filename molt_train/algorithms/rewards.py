"""Reward shaping before the estimator, and DAPO-style dynamic filtering.

Shaping (``shape_rewards``) runs per rollout, so every segment of a rollout
keeps the same reward, in this order:

1. a length penalty, at most one of
   - DAPO overlong buffer: with ``peak`` = the longest segment of the
     rollout (a rollout's segments are separate contexts, so the peak, not
     the sum, is what approaches ``max_len``) and
     ``excess = peak - (max_len - overlong_buffer_len)``:
     ``r += -min(excess, buffer) / buffer * overlong_penalty_factor`` if excess > 0;
   - ProRL stop-properly, for a truncated rollout (any segment truncated):
     ``r = coef * r`` for coef in [0, 1], ``r = coef`` for coef < 0;
2. clipping to ``clip_range``.

Metrics: ``overlong_penalty`` / ``stop_properly_penalty`` = mean change of the
reward per rollout (0 or negative for the overlong penalty).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Protocol

import torch
from torch import Tensor

from molt_train.algorithms.grouping import index_by


class RewardShaping(Protocol):
    """The ``--reward.*`` settings ``shape_rewards`` reads (``molt_train.config.algo.RewardConfig`` has them): the
    algorithms import nothing of the config, which imports their registries."""

    @property
    def clip_range(self) -> tuple[float, float] | None: ...
    @property
    def overlong_buffer_len(self) -> int: ...
    @property
    def overlong_penalty_factor(self) -> float: ...
    @property
    def stop_properly_penalty_coef(self) -> float | None: ...


def shape_rewards(
    rewards: Tensor,
    rollout_ids: Sequence[Hashable],
    lengths: Tensor,
    truncated: Tensor,
    shaping: RewardShaping,
    max_len: int,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Apply the ``--reward.*`` settings to per-row rewards (N,), given each row's length and truncation.

    ``lengths`` (N,) is the segment length measured in the unit of ``max_len``
    (the context limit, ``--data.max_len``); ``truncated`` (N,) bool.
    ``overlong_buffer_len`` 0 and ``stop_properly_penalty_coef`` None are off;
    ``clip_range`` None disables clipping. Returns (shaped rewards (N,)
    float32 on the device of ``rewards``, metrics); the work itself is done on CPU.
    """
    n = rewards.shape[0]
    if not len(rollout_ids) == lengths.shape[0] == truncated.shape[0] == n:
        raise ValueError(
            f"need one rollout_id, length and truncated flag per reward: {n} rewards, "
            f"{len(rollout_ids)} ids, {lengths.shape[0]} lengths, {truncated.shape[0]} flags"
        )
    rollout_of_row, first_rows = index_by(rollout_ids)
    num_rollouts = len(first_rows)
    shaped = rewards.detach().float().cpu().clone()
    metrics: dict[str, Tensor] = {}

    if shaping.overlong_buffer_len:
        buffer = shaping.overlong_buffer_len
        peak = torch.zeros(num_rollouts).scatter_reduce(
            0, rollout_of_row, lengths.float().cpu(), "amax", include_self=False
        )
        excess = (peak - (max_len - buffer)).clamp(0, buffer)
        penalty = -excess / buffer * shaping.overlong_penalty_factor
        shaped = shaped + penalty[rollout_of_row]
        metrics["overlong_penalty"] = penalty.mean()

    if shaping.stop_properly_penalty_coef is not None:
        coef = shaping.stop_properly_penalty_coef
        any_truncated = torch.zeros(num_rollouts, dtype=torch.bool)
        any_truncated[rollout_of_row[truncated.bool().cpu()]] = True
        row_truncated = any_truncated[rollout_of_row]
        penalized = shaped * coef if coef >= 0 else torch.full_like(shaped, coef)
        before = shaped
        shaped = torch.where(row_truncated, penalized, shaped)
        metrics["stop_properly_penalty"] = (shaped - before)[first_rows].mean()

    if shaping.clip_range is not None:
        shaped = shaped.clamp(*shaping.clip_range)
    return shaped.to(rewards.device), metrics


def dynamic_filtering(
    group_ids: Sequence[Hashable],
    rollout_ids: Sequence[Hashable],
    scores: Sequence[float | None],
    *,
    n_samples_per_prompt: int,
    score_range: tuple[float, float] = (0.0, 1.0),
) -> tuple[list[int], dict[str, float]]:
    """Keep the prompt groups whose rollouts still disagree (DAPO dynamic sampling).

    Per row: its group, rollout and score (None = the agent gave no score).
    Per group: (1) one representative (first row) per rollout; (2) fewer than
    ``n_samples_per_prompt`` rollouts -> dropped as incomplete; (3) any
    unscored rollout -> kept; (4) else kept iff ``low < mean(score) < high``
    (strict, so all-correct and all-wrong groups go).

    Returns the kept row indices (every segment of a kept group, in input
    order) and metrics: ``dynamic_filtering_pass_rate`` (kept / groups),
    ``dynamic_filtering_incomplete_groups``, ``rollout/pre_filter_mean_score``
    (over scored representatives), ``rollout/group_all_pass_rate`` (complete
    scored groups with mean >= high) and ``rollout/group_all_fail_rate``
    (mean <= low), both over all groups.
    """
    if n_samples_per_prompt < 2:
        raise ValueError(f"dynamic filtering needs n_samples_per_prompt > 1, got {n_samples_per_prompt}")
    low, high = score_range
    if not low < high:
        raise ValueError(f"dynamic_filtering_range must be (low, high) with low < high, got {score_range}")
    if not len(group_ids) == len(rollout_ids) == len(scores):
        raise ValueError(
            f"need one group_id, rollout_id and score per row, got {len(group_ids)}, {len(rollout_ids)}, {len(scores)}"
        )
    group_of_row, _ = index_by(group_ids)
    _, first_rows = index_by(rollout_ids)
    group_scores: dict[int, list[float | None]] = {}
    for row in first_rows:
        group_scores.setdefault(int(group_of_row[row]), []).append(scores[row])

    kept_groups, incomplete, all_pass, all_fail = set(), 0, 0, 0
    for group, rollout_scores in group_scores.items():
        if len(rollout_scores) < n_samples_per_prompt:
            incomplete += 1
        elif any(score is None for score in rollout_scores):
            kept_groups.add(group)
        else:
            mean = sum(rollout_scores) / len(rollout_scores)
            if low < mean < high:
                kept_groups.add(group)
            all_pass += mean >= high
            all_fail += mean <= low

    num_groups = max(len(group_scores), 1)
    scored = [scores[row] for row in first_rows if scores[row] is not None]
    metrics = {
        "dynamic_filtering_pass_rate": len(kept_groups) / num_groups,
        "dynamic_filtering_incomplete_groups": float(incomplete),
        "rollout/pre_filter_mean_score": sum(scored) / len(scored) if scored else 0.0,
        "rollout/group_all_pass_rate": all_pass / num_groups,
        "rollout/group_all_fail_rate": all_fail / num_groups,
    }
    kept_rows = [row for row, group in enumerate(group_of_row.tolist()) if group in kept_groups]
    return kept_rows, metrics
