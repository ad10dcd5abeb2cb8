"""Advantage estimators: rewards (one per row) -> per-token advantages.

A row is one training sequence: a whole rollout, or one segment of a chat
rollout that was split (context compaction, template rewrite). Segments of
one rollout share its ``rollout_id`` and its reward; the rollouts sampled
for one prompt share a ``group_id``.

- ``reinforce`` (REINFORCE++) works per row: every row gets its reward on its
  last action token, minus a per-token KL penalty, summed backwards.
- The group estimators (``reinforce_baseline``, ``rloo``, ``grpo``,
  ``dr_grpo``) first collapse rows to one reward per rollout (so a rollout
  split into three segments counts once in its group's baseline), compute
  one scalar advantage per rollout, and broadcast it back onto every action
  token of every segment of that rollout.

KL as a reward (``kl`` with ``kl_coef`` beta > 0) is a per-token reward
``-beta * kl_t`` on every action token. Every estimator adds its return-to-go
``sum_{k>=t} -beta * kl_k`` (within the row; ``reinforce`` discounts it with
gamma) to the advantage of token t: ``reinforce`` folds it into its returns;
the group estimators add it to the broadcast per-rollout advantage, after the
group baseline and before whitening. The baseline stays one of task rewards.

``flash_reinforce`` (FlashREINFORCE, one rollout per prompt) collapses rows to one reward per rollout like the group
estimators, but its baseline is the mean over every rollout of the batch (no std, no whitening).

``gae`` (PPO with a critic) takes ``reinforce``'s per-token rewards and the critic's ``values`` (see ``gae``).
``on_policy_distill`` has no task reward at all: its advantage is the per-token KL reward ``-beta * kl_t`` itself
(``kl`` = log pi_old - log pi_teacher, k1), not summed, not whitened.

Whitening (``reinforce``, ``reinforce_baseline``; off with ``no_whiten``):
``(X - mu) * rsqrt(max(var, 1e-8))`` where mu and the (biased) var are taken
over all action tokens of the batch; non-action positions stay 0.

Every estimator returns ``(advantages, returns)``, both (N, L) float32 and
zero outside ``action_mask``. ``returns`` is the un-whitened signal (the
discounted return for ``reinforce``, the broadcast per-rollout advantage for
the group estimators).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from molt_train.algorithms.grouping import index_by
from molt_train.algorithms.masked import masked_mean

WHITEN_VAR_FLOOR = 1e-8
GRPO_STD_EPS = 1e-9


@dataclass(frozen=True)
class AdvantageInputs:
    """Everything an estimator may read. One entry per row (N rows, L positions).

    rewards: (N,) scalar reward per row (segments of one rollout carry the same one).
    action_mask: (N, L) bool, True on positions the policy generated.
    group_ids: N prompt-group ids. rollout_ids: N rollout ids.
    kl: (N, L) per-token KL (``approx_kl(logp_old, logp_ref, ...)``) or None;
        a per-token reward ``-kl_coef * kl`` for every estimator.
    gamma: discount of ``reinforce`` and ``gae`` (``reinforce``: per dense position; ``gae``: per action token).
    no_whiten: skip whitening in ``reinforce`` / ``reinforce_baseline`` / ``gae``.
    values: (N, L) the critic's V of each position (``gae``). lam: GAE's lambda.
    """

    rewards: Tensor
    action_mask: Tensor
    group_ids: Sequence[str]
    rollout_ids: Sequence[str]
    kl: Tensor | None = None
    kl_coef: float = 0.0
    gamma: float = 1.0
    no_whiten: bool = False
    values: Tensor | None = None
    lam: float = 1.0

    def __post_init__(self) -> None:
        n = self.rewards.shape[0]
        if self.rewards.dim() != 1:
            raise ValueError(f"rewards must have shape (N,), got {tuple(self.rewards.shape)}")
        if self.action_mask.dim() != 2 or self.action_mask.shape[0] != n:
            raise ValueError(f"action_mask must have shape (N={n}, L), got {tuple(self.action_mask.shape)}")
        if self.action_mask.dtype != torch.bool:
            raise ValueError(f"action_mask must be bool, got {self.action_mask.dtype}")
        if len(self.group_ids) != n or len(self.rollout_ids) != n:
            raise ValueError(
                f"need one group_id and one rollout_id per row: {n} rows, "
                f"{len(self.group_ids)} group_ids, {len(self.rollout_ids)} rollout_ids"
            )
        if self.kl is not None and self.kl.shape != self.action_mask.shape:
            raise ValueError(f"kl must match action_mask {tuple(self.action_mask.shape)}, got {tuple(self.kl.shape)}")
        if not 0.0 < self.gamma <= 1.0:
            raise ValueError(f"gamma must be in (0, 1], got {self.gamma}")
        if self.values is not None and self.values.shape != self.action_mask.shape:
            raise ValueError(
                f"values must match action_mask {tuple(self.action_mask.shape)}, got {tuple(self.values.shape)}"
            )
        if not 0.0 <= self.lam <= 1.0:
            raise ValueError(f"lam must be in [0, 1], got {self.lam}")


Estimator = Callable[[AdvantageInputs], tuple[Tensor, Tensor]]
ESTIMATORS: dict[str, Estimator] = {}


def register_estimator(name: str) -> Callable[[Estimator], Estimator]:
    """Decorator: register ``fn(inputs) -> (advantages, returns)`` under ``name``."""

    def register(fn: Estimator) -> Estimator:
        if name in ESTIMATORS:
            raise ValueError(f"advantage estimator {name!r} is already registered")
        ESTIMATORS[name] = fn
        return fn

    return register


def get_estimator(name: str) -> Estimator:
    """The estimator registered as ``name``; a ValueError lists the valid names."""
    if name not in ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {name!r}; choose one of {sorted(ESTIMATORS)}")
    return ESTIMATORS[name]


def whiten(values: Tensor, mask: Tensor) -> Tensor:
    """``(X - mu) * rsqrt(max(var, 1e-8))`` over the action tokens; 0 elsewhere."""
    mean = masked_mean(values, mask)
    var = masked_mean((values - mean) ** 2, mask)
    whitened = (values - mean) * var.clamp(min=WHITEN_VAR_FLOOR).rsqrt()
    return torch.where(mask, whitened, torch.zeros_like(whitened))


def kl_rewards(inputs: AdvantageInputs) -> Tensor:
    """The per-token KL reward ``-beta * kl_t`` on action tokens (0 elsewhere, and without a KL), (N, L) float32."""
    mask = inputs.action_mask
    zeros = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    if inputs.kl is None or inputs.kl_coef == 0.0:
        return zeros
    return torch.where(mask, -inputs.kl_coef * inputs.kl.float(), zeros)


def returns_to_go(token_rewards: Tensor, gamma: float = 1.0) -> Tensor:
    """``G_t = sum_{k>=t} gamma^(k-t) r_k`` along each row."""
    if gamma == 1.0:
        return token_rewards.flip(1).cumsum(1).flip(1)
    returns = torch.zeros_like(token_rewards)
    running = torch.zeros(token_rewards.shape[0], device=token_rewards.device)
    for t in reversed(range(token_rewards.shape[1])):
        running = token_rewards[:, t] + gamma * running
        returns[:, t] = running
    return returns


@register_estimator("reinforce")
def reinforce(inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """REINFORCE++: r_t = -beta*kl_t + [t = last action token]*R; G_t = sum_k>=t gamma^(k-t) r_k.

    The discount runs over every dense position (observation tokens inside a
    multi-turn row included); they carry no reward of their own.
    """
    mask = inputs.action_mask
    returns = returns_to_go(token_rewards(inputs), inputs.gamma)
    returns = torch.where(mask, returns, torch.zeros_like(returns))
    advantages = returns if inputs.no_whiten else whiten(returns, mask)
    return advantages, returns


@dataclass(frozen=True)
class _GroupedRollouts:
    """One reward per rollout (U rollouts) with its group's size and mean, on CPU."""

    reward: Tensor  # (U,)
    group_size: Tensor  # (U,) number of rollouts in this rollout's group
    group_mean: Tensor  # (U,)
    group_of_rollout: Tensor  # (U,) long
    num_groups: int
    rollout_of_row: Tensor  # (N,) long

    @classmethod
    def from_inputs(cls, inputs: AdvantageInputs) -> _GroupedRollouts:
        rollout_of_row, first_rows = index_by(inputs.rollout_ids)
        first_group = [inputs.group_ids[row] for row in first_rows]
        for row, rollout in enumerate(rollout_of_row.tolist()):
            if inputs.group_ids[row] != first_group[rollout]:
                raise ValueError(
                    f"rollout {inputs.rollout_ids[row]!r} appears in groups "
                    f"{first_group[rollout]!r} and {inputs.group_ids[row]!r}; "
                    "all segments of a rollout must carry its group_id"
                )
        rewards = inputs.rewards.detach().float().cpu()
        reward = rewards[first_rows]
        differs = (rewards != reward[rollout_of_row]).nonzero()
        if len(differs):
            row = int(differs[0])
            raise ValueError(
                f"rollout {inputs.rollout_ids[row]!r} has segments with rewards "
                f"{reward[rollout_of_row[row]].item()} and {rewards[row].item()}; stamp the "
                "rollout's reward on every segment before estimating advantages"
            )
        group_of_rollout, group_first = index_by(first_group)
        num_groups = len(group_first)
        size = torch.zeros(num_groups).index_add_(0, group_of_rollout, torch.ones_like(reward))
        total = torch.zeros(num_groups).index_add_(0, group_of_rollout, reward)
        return cls(
            reward=reward,
            group_size=size[group_of_rollout],
            group_mean=(total / size)[group_of_rollout],
            group_of_rollout=group_of_rollout,
            num_groups=num_groups,
            rollout_of_row=rollout_of_row,
        )

    def unbiased_group_std(self) -> Tensor:
        """Per-rollout std of its group's rewards (divisor n - 1); NaN for singletons."""
        squared = (self.reward - self.group_mean) ** 2
        sums = torch.zeros(self.num_groups).index_add_(0, self.group_of_rollout, squared)
        return (sums[self.group_of_rollout] / (self.group_size - 1)).sqrt()

    def broadcast(self, per_rollout: Tensor, inputs: AdvantageInputs) -> Tensor:
        """Each rollout's scalar on every action token of each of its rows, plus the row's KL return-to-go."""
        mask = inputs.action_mask
        per_row = per_rollout[self.rollout_of_row].to(mask.device)[:, None] + returns_to_go(kl_rewards(inputs))
        return torch.where(mask, per_row, torch.zeros(mask.shape, device=mask.device))


@register_estimator("reinforce_baseline")
def reinforce_baseline(inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """A = R - mean(R of the group), then whitened over the batch's action tokens."""
    rollouts = _GroupedRollouts.from_inputs(inputs)
    returns = rollouts.broadcast(rollouts.reward - rollouts.group_mean, inputs)
    advantages = returns if inputs.no_whiten else whiten(returns, inputs.action_mask)
    return advantages, returns


@register_estimator("flash_reinforce")
def flash_reinforce(inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """FlashREINFORCE's one-batch baseline: A = R - mean(R over every rollout of the batch), no std, no whitening.

    One rollout per prompt, so there is no group to compare with: the baseline is the mean reward of the batch's
    rollouts (each counted once, however many segments it has), the whole batch, before any micro-batch split.
    """
    rollouts = _GroupedRollouts.from_inputs(inputs)
    advantages = rollouts.broadcast(rollouts.reward - rollouts.reward.mean(), inputs)
    return advantages, advantages


@register_estimator("rloo")
def rloo(inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """A = R - mean of the *other* rollouts of the group; a singleton keeps A = R."""
    rollouts = _GroupedRollouts.from_inputs(inputs)
    n = rollouts.group_size
    leave_one_out = (n * rollouts.group_mean - rollouts.reward) / (n - 1)
    per_rollout = torch.where(n > 1, rollouts.reward - leave_one_out, rollouts.reward)
    advantages = rollouts.broadcast(per_rollout, inputs)
    return advantages, advantages


@register_estimator("grpo")
def grpo(inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """A = (R - mean) / (std + 1e-9), unbiased std; a singleton group gives A = 0."""
    rollouts = _GroupedRollouts.from_inputs(inputs)
    centered = rollouts.reward - rollouts.group_mean
    scaled = centered / (rollouts.unbiased_group_std() + GRPO_STD_EPS)
    per_rollout = torch.where(rollouts.group_size > 1, scaled, torch.zeros_like(scaled))
    advantages = rollouts.broadcast(per_rollout, inputs)
    return advantages, advantages


@register_estimator("dr_grpo")
def dr_grpo(inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """A = R - mean(R of the group), no std scaling, no whitening."""
    rollouts = _GroupedRollouts.from_inputs(inputs)
    advantages = rollouts.broadcast(rollouts.reward - rollouts.group_mean, inputs)
    return advantages, advantages


def token_rewards(inputs: AdvantageInputs) -> Tensor:
    """``reinforce``'s per-token reward: ``-beta * kl_t`` plus the row's reward on its last action token."""
    mask = inputs.action_mask
    rewards_t = kl_rewards(inputs)
    last_action = mask.shape[1] - 1 - mask.flip(1).int().argmax(1)
    has_action = mask.any(1)
    rows = torch.arange(mask.shape[0], device=mask.device)[has_action]
    rewards = inputs.rewards.float().to(mask.device)
    rewards_t[rows, last_action[has_action]] += rewards[has_action]
    return rewards_t


@register_estimator("gae")
def gae(inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """PPO's GAE over the critic's ``values``: r_t as ``reinforce``; ``delta_t = r_t + gamma*V_next - V_t``,
    ``A_t = delta_t + gamma*lam*A_next`` with V and A after the last action token 0. Non-action positions are
    transparent: the running A and the bootstrap V are carried across an observation gap. Returns = A + V (the
    critic's target, not whitened); advantages = whiten(A) unless ``no_whiten``."""
    if inputs.values is None:
        raise ValueError("gae needs the critic's values (AdvantageInputs.values)")
    mask = inputs.action_mask
    rewards_t = token_rewards(inputs)
    values = torch.where(mask, inputs.values.float().to(mask.device), torch.zeros_like(rewards_t))
    advantages = torch.zeros_like(rewards_t)
    running = torch.zeros(mask.shape[0], device=mask.device)
    next_value = torch.zeros_like(running)
    for t in reversed(range(mask.shape[1])):
        acting = mask[:, t]
        delta = rewards_t[:, t] + inputs.gamma * next_value - values[:, t]
        step = delta + inputs.gamma * inputs.lam * running
        running = torch.where(acting, step, running)
        next_value = torch.where(acting, values[:, t], next_value)
        advantages[:, t] = torch.where(acting, step, torch.zeros_like(step))
    returns = torch.where(mask, advantages + values, torch.zeros_like(values))
    return (advantages if inputs.no_whiten else whiten(advantages, mask)), returns


@register_estimator("on_policy_distill")
def on_policy_distill(inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """A_t = -beta * (log pi_old - log pi_teacher)_t: the per-token reverse KL to the teacher (``kl``, k1) is the
    whole signal; the task reward is ignored, nothing is whitened. Needs ``kl`` (the teacher is the reference)."""
    if inputs.kl is None or inputs.kl_coef == 0.0:
        raise ValueError("on_policy_distill needs the per-token KL to the teacher (kl) and a kl_coef > 0")
    advantages = kl_rewards(inputs)
    return advantages, advantages
