"""Score centering (``--algo.advantage.score_centering_top_k k``): REINFORCE without the sampler's drift.

At one position the engine sampled y from its distribution q; the trainer's is p. The per-token update
``A * f(r_y) * grad log p_y`` (``f``: the token-level IS weight of ``r = p / q``, 1 without IS correction) has,
under y ~ q, the reward-independent mean ``sum_v q_v f(r_v) grad log p_v``; training on

    f(r_y) log p_y - C,   C = sum_v q_v f(r_v) log p_v

removes it (the weights ``q_v f(r_v)`` are constants). The engine reports its top-k log-probs only, so the sum runs
over those k candidates K and the rest of q's mass, ``1 - Q_K``, is spread over the other tokens like p:
``q_v ~ (1 - Q_K) * p_v / (1 - P_K)`` for v outside K (``r_v = (1 - P_K) / (1 - Q_K)`` there). ``r`` and the tail
weights use the trainer's log-probs detached (the recomputed pi_old when a batch takes one optimizer step).

``f`` is the token-level weight of ``is_correction`` (``level`` off: 1; ``token`` with ``mask`` (IcePop: r inside
the band, else 0), ``trunc`` (TIS: min(r, high)) or ``clip``); a sequence gate has no per-candidate form and is
refused.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from molt_train.algorithms.is_correction import LOG_RATIO_LIMIT, parse_threshold

TAIL_FLOOR = 1e-6


def candidate_is_weight(log_r: Tensor, *, level: str, mode: str, threshold: float | Sequence[float]) -> Tensor:
    """``f(r)`` for log-ratios ``log_r`` (any shape), detached."""
    if level == "off":
        return torch.ones_like(log_r)
    if level != "token":
        raise ValueError(
            f"score centering composes with a token-level IS weight only, got is_correction_level {level!r}"
        )
    low, high = parse_threshold(threshold)
    r = log_r.detach().clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT).exp()
    if mode == "mask":
        return torch.where((r < low) | (r > high), torch.zeros_like(r), r)
    if mode == "clip":
        return r.clamp(low, high)
    return r.clamp(max=high)


def centering_term(
    cand_logp: Tensor,
    cand_logq: Tensor,
    expected_logp: Tensor,
    *,
    level: str = "off",
    mode: str = "mask",
    threshold: float | Sequence[float] = (0.5, 5.0),
) -> Tensor:
    """C per position (same shape as ``expected_logp``), with gradient through the trainer's log-probs only.

    Args:
        cand_logp: (..., k) the trainer's log p of the engine's top-k candidates (with gradient).
        cand_logq: (..., k) the engine's log q of those candidates.
        expected_logp: (...) ``sum_v sg(p_v) log p_v`` over the whole vocabulary (with gradient through log p).
        level, mode, threshold: the token-level IS weight f (``--algo.advantage.is_correction_*``).
    """
    p_k = cand_logp.detach().exp()
    q_k = cand_logq.float().exp()
    weights = q_k * candidate_is_weight(cand_logp.detach() - cand_logq, level=level, mode=mode, threshold=threshold)
    head = (weights * cand_logp).sum(-1)
    tail_p = (1 - p_k.sum(-1)).clamp(min=TAIL_FLOOR)
    tail_q = (1 - q_k.sum(-1)).clamp(min=0)
    tail_sum = expected_logp - (p_k * cand_logp).sum(-1)  # sum over v outside K of sg(p_v) log p_v
    tail_f = candidate_is_weight(
        (tail_p / tail_q.clamp(min=TAIL_FLOOR)).log(), level=level, mode=mode, threshold=threshold
    )
    return head + (tail_q / tail_p * tail_f) * tail_sum
