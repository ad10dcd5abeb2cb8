"""Per-token KL estimators between a sampling policy and another policy.

``approx_kl(logp, logp_other)`` estimates KL(pi || pi_other) from tokens
sampled by ``pi`` (Schulman's k1/k2/k3), with delta = logp - logp_other:

- ``k1``: delta (unbiased, can be negative; only NaN/inf are sanitised)
- ``k2``: delta**2 / 2, clamped to [-10, 10]
- ``k3``: exp(-delta) - 1 + delta (unbiased and >= 0), clamped to [-10, 10];
  delta is clamped to [-30, 30] first so exp() cannot overflow (an inf
  there would turn the clamped-away gradient into NaN)

delta is sanitised first: NaN -> 0, +inf -> 30, -inf -> -30.

Used three ways: as a per-token reward for ``reinforce`` (computed from
pi_old vs pi_ref), as a loss term (``losses.kl_loss``, current pi vs pi_ref),
and as the rollout/train mismatch metric.
"""

from __future__ import annotations

import torch
from torch import Tensor

KL_ESTIMATORS = ("k1", "k2", "k3")
DELTA_LIMIT = 30.0
KL_CLAMP = 10.0


def approx_kl(logp: Tensor, logp_other: Tensor, estimator: str = "k1") -> Tensor:
    """Per-token estimate of KL(pi || pi_other), same shape as ``logp``."""
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL estimator {estimator!r}; choose one of {KL_ESTIMATORS}")
    delta = torch.nan_to_num(logp - logp_other, nan=0.0, posinf=DELTA_LIMIT, neginf=-DELTA_LIMIT)
    if estimator == "k1":
        return delta
    if estimator == "k2":
        return (delta**2 / 2).clamp(-KL_CLAMP, KL_CLAMP)
    delta = delta.clamp(-DELTA_LIMIT, DELTA_LIMIT)
    return (torch.exp(-delta) - 1 + delta).clamp(-KL_CLAMP, KL_CLAMP)
