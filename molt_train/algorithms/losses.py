"""Policy losses (per token) and how per-token losses become one scalar.

Step 1, a registered policy loss turns log-probs and advantages into a
per-token loss (N, L), zero outside ``mask``, plus detached metrics.
Step 2 (optional), the trainer multiplies it by the IS-correction weights.
Step 3, ``aggregate`` reduces it to a scalar with one of the modes:

- ``token-mean``: every action token weighs the same,
  ``sum(l * m) / num_tokens``.
- ``seq-mean-token-mean``: every rollout weighs the same: token mean inside
  each unit, then mean over units. A unit is a row, or (with ``unit_ids`` =
  rollout ids) all segments of one rollout.
- ``prompt-mean-token-mean``: every prompt weighs the same: token mean over
  all action tokens of a prompt group's rollouts (``unit_ids`` = group ids),
  then mean over prompts.

Global denominators. A scalar from one micro-batch is only part of the
optimizer step. Pass the counts of the whole optimizer window (all
micro-batches of the step, on all workers) and the micro-batch scalars sum to
exactly the window's loss:

- ``token-mean``: ``num_tokens`` = action tokens in the window;
- grouped modes: ``unit_tokens`` = {unit id: action tokens of that unit in the
  window} (``unit_token_counts`` per micro-batch, summed) and ``num_units`` =
  units in the window (defaults to the units of ``unit_tokens`` that have
  tokens).

Without them the denominators are this call's own counts. If gradients are
averaged over W data-parallel workers (FSDP does), multiply the scalar by W.
IS-dropped tokens stay in every denominator (their loss is 0, not absent).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Mapping, Sequence

import torch
from torch import Tensor

from molt_train.algorithms.kl import approx_kl
from molt_train.algorithms.masked import masked_mean

LOG_RATIO_LIMIT = 30.0
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-mean", "prompt-mean-token-mean")

PolicyLoss = Callable[..., tuple[Tensor, dict[str, Tensor]]]
POLICY_LOSSES: dict[str, PolicyLoss] = {}


def register_policy_loss(name: str) -> Callable[[PolicyLoss], PolicyLoss]:
    """Decorator: register ``fn(logp, logp_old, advantages, mask, **opts)`` under ``name``.

    The function returns ``(loss_tokens (N, L) zero outside mask, metrics)``.
    """

    def register(fn: PolicyLoss) -> PolicyLoss:
        if name in POLICY_LOSSES:
            raise ValueError(f"policy loss {name!r} is already registered")
        POLICY_LOSSES[name] = fn
        return fn

    return register


def get_policy_loss(name: str) -> PolicyLoss:
    """The policy loss registered as ``name``; a ValueError lists the valid names."""
    if name not in POLICY_LOSSES:
        raise ValueError(f"unknown policy loss {name!r}; choose one of {sorted(POLICY_LOSSES)}")
    return POLICY_LOSSES[name]


@register_policy_loss("ppo")
def ppo_loss(
    logp: Tensor,
    logp_old: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    dual_clip: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped surrogate ``-min(rho*A, clip(rho, 1-eps_low, 1+eps_high)*A)``.

    rho = exp(clamp(logp - logp_old, +-30)) with NaN -> 0 in the log-ratio.
    Dual clip (c > 1): where A < 0 the loss is ``-max(min(...), c*A)``, so a huge
    ratio on a bad token cannot blow the loss up. Garbage (NaN/inf) outside
    ``mask`` never reaches the loss or its gradient.

    Metrics (0-d, detached, over this call's action tokens): ``clip_ratio``
    (tokens where the clipped branch is taken), ``dual_clip_ratio``, and
    ``ppo_kl`` (mean logp_old - logp).
    """
    if eps_low < 0 or eps_high < 0:
        raise ValueError(f"eps_low/eps_high must be >= 0, got ({eps_low}, {eps_high})")
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1 (e.g. 10) or None to disable, got {dual_clip}")
    zeros = torch.zeros_like(logp)
    log_ratio = _log_ratio(logp, logp_old, mask)
    ratio = log_ratio.exp()
    advantages = torch.where(mask, advantages, zeros)

    unclipped = ratio * advantages
    clipped = ratio.clamp(1 - eps_low, 1 + eps_high) * advantages
    surrogate = torch.minimum(unclipped, clipped)
    dual_active = torch.zeros_like(mask)
    if dual_clip is not None:
        dual_bound = dual_clip * advantages
        dual_active = (advantages < 0) & (dual_bound > surrogate)
        surrogate = torch.where(dual_active, dual_bound, surrogate)
    loss_tokens = torch.where(mask, -surrogate, zeros)

    metrics = {
        "clip_ratio": masked_mean((clipped < unclipped).float(), mask),
        "dual_clip_ratio": masked_mean(dual_active.float(), mask),
        "ppo_kl": masked_mean(-log_ratio, mask),
    }
    return loss_tokens, {k: v.detach() for k, v in metrics.items()}


def _log_ratio(logp: Tensor, logp_old: Tensor, mask: Tensor) -> Tensor:
    """``clamp(logp - logp_old, +-30)`` on action tokens (NaN -> 0), 0 elsewhere."""
    log_ratio = torch.where(mask, logp - logp_old, torch.zeros_like(logp))
    return torch.nan_to_num(log_ratio, nan=0.0).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)


@register_policy_loss("gspo")
def gspo_loss(
    logp: Tensor,
    logp_old: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    dual_clip: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """GSPO: one ratio per sequence, ``s = exp(mean_t(logp - logp_old))`` over the row's action tokens.

    It is applied per token as ``rho_t = exp(logp_t - sg(logp_t) + sg(log s))`` (value ``s``, gradient
    ``s * grad logp_t``: each token keeps its own gradient), in the clipped surrogate
    ``-min(rho_t*A, clip(rho_t, 1-eps_low, 1+eps_high)*A)``; the clip decision is the sequence's. Dual clip has no
    sequence-level form and is refused. Metrics: ``clip_ratio`` (tokens of clipped rows), ``ppo_kl``.
    """
    if dual_clip is not None:
        raise ValueError(f"gspo has no dual clip (got dual_clip={dual_clip}); leave it unset")
    if eps_low < 0 or eps_high < 0:
        raise ValueError(f"eps_low/eps_high must be >= 0, got ({eps_low}, {eps_high})")
    zeros = torch.zeros_like(logp)
    log_ratio = _log_ratio(logp, logp_old, mask)
    log_s = masked_mean(log_ratio, mask, dim=1).detach()[:, None]
    token_logp = torch.where(mask, logp, zeros)
    ratio = (token_logp - token_logp.detach() + log_s).exp()
    advantages = torch.where(mask, advantages, zeros)
    unclipped = ratio * advantages
    clipped = ratio.clamp(1 - eps_low, 1 + eps_high) * advantages
    loss_tokens = torch.where(mask, -torch.minimum(unclipped, clipped), zeros)
    metrics = {
        "clip_ratio": masked_mean((clipped < unclipped).float(), mask),
        "ppo_kl": masked_mean(-log_ratio, mask),
    }
    return loss_tokens, {k: v.detach() for k, v in metrics.items()}


@register_policy_loss("cispo")
def cispo_loss(
    logp: Tensor,
    logp_old: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 1.2,
    dual_clip: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """CISPO: ``-sg(min(rho, eps_high)) * A * logp``; the clipped IS weight carries no gradient, so every token
    keeps a gradient (none is clipped away, unlike PPO). ``eps_high`` is an absolute ceiling >= 1 (e.g. 1.2);
    ``eps_low`` is unused. Metrics: ``clip_ratio`` (tokens whose weight hit the ceiling), ``ppo_kl``.
    """
    del eps_low
    if dual_clip is not None:
        raise ValueError(f"cispo has no dual clip (got dual_clip={dual_clip}); leave it unset")
    if eps_high < 1:
        raise ValueError(f"cispo's eps_high is an absolute ceiling on the IS weight and must be >= 1, got {eps_high}")
    zeros = torch.zeros_like(logp)
    log_ratio = _log_ratio(logp, logp_old, mask)
    weight = log_ratio.detach().exp().clamp(max=eps_high)
    advantages = torch.where(mask, advantages, zeros)
    loss_tokens = torch.where(mask, -weight * advantages * torch.where(mask, logp, zeros), zeros)
    metrics = {
        "clip_ratio": masked_mean((log_ratio.exp() > eps_high).float(), mask),
        "ppo_kl": masked_mean(-log_ratio, mask),
    }
    return loss_tokens, {k: v.detach() for k, v in metrics.items()}


def unit_token_counts(mask: Tensor, unit_ids: Sequence[Hashable]) -> dict[Hashable, int]:
    """Action tokens per unit id (rollout or prompt group) in these rows.

    Sum the dicts of all micro-batches (and workers) of an optimizer window to
    get ``aggregate(..., unit_tokens=...)``.
    """
    counts: Counter[Hashable] = Counter()
    for unit_id, tokens in zip(unit_ids, mask.sum(1).tolist(), strict=True):
        counts[unit_id] += int(tokens)
    return dict(counts)


def aggregate(
    loss_tokens: Tensor,
    mask: Tensor,
    mode: str = "token-mean",
    *,
    num_tokens: float | Tensor | None = None,
    unit_ids: Sequence[Hashable] | None = None,
    unit_tokens: Mapping[Hashable, float] | None = None,
    num_units: float | None = None,
) -> Tensor:
    """Reduce a per-token loss (N, L) to a scalar (see the module docstring).

    token-mean: ``num_tokens`` only. seq-mean-token-mean: optional ``unit_ids``
    (rollout ids; default one unit per row), ``unit_tokens`` (needs
    ``unit_ids``), ``num_units``. prompt-mean-token-mean: ``unit_ids`` (group
    ids, required), ``unit_tokens``, ``num_units``. A denominator of 0 is
    treated as 1, so an empty batch gives 0, not NaN.
    """
    if mode not in LOSS_AGG_MODES:
        raise ValueError(f"unknown loss_agg_mode {mode!r}; choose one of {LOSS_AGG_MODES}")
    row_sums = torch.where(mask, loss_tokens, torch.zeros_like(loss_tokens)).sum(1)

    if mode == "token-mean":
        if unit_ids is not None or unit_tokens is not None or num_units is not None:
            raise ValueError("token-mean takes num_tokens only, not unit_ids/unit_tokens/num_units")
        denominator = mask.sum() if num_tokens is None else torch.as_tensor(num_tokens)
        return row_sums.sum() / denominator.clamp(min=1)

    if num_tokens is not None:
        raise ValueError(f"{mode} takes unit_ids/unit_tokens/num_units, not num_tokens")
    if unit_ids is None:
        if mode == "prompt-mean-token-mean":
            raise ValueError("prompt-mean-token-mean needs unit_ids: the group_id of every row")
        if unit_tokens is not None:
            raise ValueError("unit_tokens needs unit_ids (the rollout id of every row)")
        unit_ids = range(mask.shape[0])
    if len(unit_ids) != mask.shape[0]:
        raise ValueError(f"need one unit id per row: {mask.shape[0]} rows, {len(unit_ids)} ids")
    counts = unit_token_counts(mask, unit_ids) if unit_tokens is None else unit_tokens
    missing = [unit_id for unit_id in unit_ids if unit_id not in counts]
    if missing:
        raise ValueError(
            f"unit_tokens has no count for unit {missing[0]!r}; build it with "
            "unit_token_counts over every micro-batch of the optimizer window"
        )
    row_denominator = torch.tensor([float(counts[unit_id]) for unit_id in unit_ids])
    if num_units is None:
        num_units = sum(1 for tokens in counts.values() if tokens > 0)
    per_unit_means = (row_sums / row_denominator.clamp(min=1).to(row_sums.device, row_sums.dtype)).sum()
    return per_unit_means / max(float(num_units), 1.0)


def kl_loss(
    logp: Tensor,
    logp_ref: Tensor,
    mask: Tensor,
    *,
    estimator: str = "k3",
    num_tokens: float | Tensor | None = None,
) -> Tensor:
    """KL-as-loss (``--algo.kl.use_loss``): token-mean of ``approx_kl(logp, logp_ref)``.

    Always ``token-mean`` with the window's global ``num_tokens``, whatever the
    policy loss's aggregation mode. The caller adds ``beta * kl_loss(...)``.
    """
    return aggregate(approx_kl(logp, logp_ref, estimator), mask, num_tokens=num_tokens)


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    *,
    value_clip: float | None = 0.2,
    num_tokens: float | Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The critic's clipped value loss ``0.5 * max((V - R)^2, (V_old + clip(V - V_old, +-c) - R)^2)``, token-mean
    over the window's ``num_tokens`` (``value_clip`` None: the plain ``0.5 * (V - R)^2``). Metrics:
    ``critic/clip_frac`` (tokens where the clipped branch is larger), ``critic/value_mean``."""
    zeros = torch.zeros_like(values)
    error = torch.where(mask, values - returns, zeros) ** 2
    clipped_frac = zeros
    if value_clip is not None:
        clipped = old_values + (values - old_values).clamp(-value_clip, value_clip)
        clipped_error = torch.where(mask, clipped - returns, zeros) ** 2
        clipped_frac = (clipped_error > error).float()
        error = torch.maximum(error, clipped_error)
    loss = aggregate(0.5 * error, mask, num_tokens=num_tokens)
    metrics = {"critic/clip_frac": masked_mean(clipped_frac, mask), "critic/value_mean": masked_mean(values, mask)}
    return loss, {k: v.detach() for k, v in metrics.items()}
