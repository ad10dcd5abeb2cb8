"""Importance-sampling correction for the train/rollout log-prob mismatch.

The rollout engine sampled each token with pi_rollout; the trainer's
recomputed pi_old differs (other kernels, or a weight swap mid-request under
async / partial rollout). The per-token ratio

    u_t = exp(clamp(logp_old_t - logp_rollout_t, +-20))      (detached)

is turned into a per-token weight that multiplies the per-token policy loss:

- ``level``: the unit gated against the band [low, high]
  ``off`` (weight 1), ``token`` (U = u_t), ``seq`` (U = exp(clamp(sum_t log u_t)))
  or ``geo`` (U = exp(mean_t log u_t)), sums/means over the row's action tokens.
- ``mode``: what happens to a unit outside the band
  ``mask`` drops it (weight 0); a kept unit keeps the per-token weight u_t
  (for seq/geo too: the sequence gate only decides keep or drop),
  ``clip`` weight = clamp(U, low, high), ``trunc`` weight = min(U, high).
  ``seq``/``geo`` are rejection filters and allow only ``mask``.
- ``threshold``: ``(low, high)``, or a single value = upper bound only (low = 0).
- ``gating``: what the unit is gated on. ``ratio`` (default): U above, against the band. ``binary_kl``: the
  unit's KL estimate D, kept iff ``D <= high`` (one value: the KL bound, e.g. 5e-3), with the per-token k3
  estimate ``k_t = u_t - 1 - log u_t`` of KL(pi_rollout || pi_old): ``token`` D = k_t, ``seq`` D = sum_t k_t
  (the sequence's KL: it adds over tokens), ``geo`` D = mean_t k_t. A binary gate only keeps or drops (mode
  ``mask``); kept tokens keep the exact ratio u_t (the FlashREINFORCE recipe: ``seq`` + ``binary_kl``).

Named schemes: TIS = token+trunc, IcePop = token+mask, seq-mask-tis = geo+mask.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch
from torch import Tensor

from molt_train.algorithms.kl import approx_kl
from molt_train.algorithms.masked import masked_mean

IS_LEVELS = ("off", "token", "seq", "geo")
IS_MODES = ("mask", "clip", "trunc")
IS_GATINGS = ("ratio", "binary_kl")
LOG_RATIO_LIMIT = 20.0
ALL_DROPPED_WARNING = 0.999

logger = logging.getLogger(__name__)


def parse_threshold(threshold: float | Sequence[float]) -> tuple[float, float]:
    """``(low, high)`` from ``high`` or ``[low, high]``; requires 0 <= low < high."""
    values = [float(threshold)] if isinstance(threshold, (int, float)) else list(threshold)
    if len(values) == 1:
        values = [0.0, values[0]]
    if len(values) != 2 or not 0.0 <= values[0] < values[1]:
        raise ValueError(
            f"is_correction_threshold must be HIGH or LOW HIGH with 0 <= LOW < HIGH, "
            f"got {threshold!r} (recipes use 0.99 1.01)"
        )
    return values[0], values[1]


def is_correction(
    logp_old: Tensor,
    logp_rollout: Tensor,
    mask: Tensor,
    *,
    level: str,
    mode: str,
    threshold: float | Sequence[float] = (0.5, 5.0),
    gating: str = "ratio",
) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-token IS weights (N, L), detached, 0 outside ``mask``, plus metrics.

    ``is_filter_ratio``: the fraction of units (tokens for ``token``, rows with
    action tokens for ``seq``/``geo``) outside the band, i.e. dropped (mask),
    clamped (clip) or truncated (trunc, above ``high`` only). A warning is
    logged when mask mode drops >= 99.9% of the units.
    """
    if level not in IS_LEVELS or mode not in IS_MODES:
        raise ValueError(f"unknown IS correction level={level!r} / mode={mode!r}; choose from {IS_LEVELS} / {IS_MODES}")
    zeros = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    if level == "off":
        return torch.where(mask, torch.ones_like(zeros), zeros), {"is_filter_ratio": zeros.sum()}
    if level in ("seq", "geo") and mode != "mask":
        raise ValueError(f"is_correction_level {level!r} needs mode 'mask', got {mode!r}")
    if gating not in IS_GATINGS:
        raise ValueError(f"unknown is_correction_gating {gating!r}; choose from {IS_GATINGS}")
    if gating == "binary_kl" and mode != "mask":
        raise ValueError(f"is_correction_gating 'binary_kl' keeps or drops a unit: it needs mode 'mask', got {mode!r}")
    low, high = parse_threshold(threshold)

    log_u = torch.where(mask, (logp_old - logp_rollout).detach().float(), zeros)
    log_u = torch.nan_to_num(log_u, nan=0.0).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    token_ratio = log_u.exp()

    metrics: dict[str, Tensor] = {}
    if gating == "binary_kl":
        k3 = torch.where(mask, token_ratio - 1 - log_u, zeros)
        if level == "token":
            unit, unit_mask = k3, mask
        else:
            unit = k3.sum(1) if level == "seq" else masked_mean(k3, mask, dim=1)
            unit_mask = mask.any(1)
            metrics["is_seq_kl_mean"] = masked_mean(unit, unit_mask)
        outside = unit > high
    else:
        if level == "token":
            unit, unit_mask = token_ratio, mask  # (N, L)
        else:
            seq_log = log_u.sum(1) if level == "seq" else masked_mean(log_u, mask, dim=1)
            unit, unit_mask = seq_log.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT).exp(), mask.any(1)  # (N,)
            metrics["is_seq_ratio_mean"] = masked_mean(unit, unit_mask)
        outside = unit > high if mode == "trunc" else (unit < low) | (unit > high)
    filter_ratio = masked_mean(outside.float(), unit_mask)
    metrics["is_filter_ratio"] = filter_ratio

    if level != "token":  # seq/geo are mask-only: the gate decides, tokens keep u_t
        weights = torch.where(outside[:, None], zeros, token_ratio)
    elif mode == "mask":
        weights = torch.where(outside, zeros, token_ratio)
    elif mode == "clip":
        weights = token_ratio.clamp(low, high)
    else:
        weights = token_ratio.clamp(max=high)
    weights = torch.where(mask, weights, zeros)

    if mode == "mask" and unit_mask.any() and filter_ratio >= ALL_DROPPED_WARNING:
        logger.warning(
            "IS correction (%s/%s, band [%g, %g], gating %s) dropped %.1f%% of units: almost nothing "
            "trains this step; widen is_correction_threshold or check the weight sync",
            level,
            mode,
            low,
            high,
            gating,
            100 * float(filter_ratio),
        )
    return weights, metrics


def mismatch_metrics(logp_train: Tensor, logp_rollout: Tensor, mask: Tensor) -> dict[str, Tensor]:
    """How far the trainer's log-probs are from the rollout engine's, over valid tokens.

    - ``mismatch/bitwise_frac``: fraction whose fp32 bytes differ (0 = bitwise equal)
    - ``mismatch/abs_diff_mean``: mean |logp_train - logp_rollout|
    - ``mismatch/k3_kl``: mean k3 estimate of KL(pi_rollout || pi_train)
    - ``vllm_kl``: mean (logp_rollout - logp_train), signed (k1)
    """
    train = logp_train.detach().float()
    rollout = logp_rollout.detach().float()
    differs = train.view(torch.int32) != rollout.view(torch.int32)
    return {
        "mismatch/bitwise_frac": masked_mean(differs.float(), mask),
        "mismatch/abs_diff_mean": masked_mean((train - rollout).abs(), mask),
        "mismatch/k3_kl": masked_mean(approx_kl(rollout, train, "k3"), mask),
        "vllm_kl": masked_mean(rollout - train, mask),
    }
