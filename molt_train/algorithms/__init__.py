"""Pure-tensor RL algorithms of the trainer: estimators, losses, KL, IS, rewards.

Read in this order: ``estimators`` (rewards -> advantages), ``losses``
(advantages -> per-token loss -> scalar), ``kl``, ``is_correction``,
``rewards`` (shaping and dynamic filtering before the estimator).

May import: torch, and nothing of ``molt_train`` outside this package (``molt_train.config`` imports the registries
here as the choices of its flags; a function reads the settings it is passed). Its modules import each other by
their defining module, never through this ``__init__``.
"""

from molt_train.algorithms.estimators import (
    ESTIMATORS,
    AdvantageInputs,
    get_estimator,
    register_estimator,
    whiten,
)
from molt_train.algorithms.is_correction import (
    IS_GATINGS,
    IS_LEVELS,
    IS_MODES,
    is_correction,
    mismatch_metrics,
    parse_threshold,
)
from molt_train.algorithms.kl import KL_ESTIMATORS, approx_kl
from molt_train.algorithms.losses import (
    LOSS_AGG_MODES,
    POLICY_LOSSES,
    aggregate,
    get_policy_loss,
    kl_loss,
    ppo_loss,
    register_policy_loss,
    unit_token_counts,
    value_loss,
)
from molt_train.algorithms.masked import masked_mean
from molt_train.algorithms.rewards import dynamic_filtering, shape_rewards
from molt_train.algorithms.score_centering import centering_term

__all__ = [
    "ESTIMATORS",
    "IS_GATINGS",
    "IS_LEVELS",
    "IS_MODES",
    "KL_ESTIMATORS",
    "LOSS_AGG_MODES",
    "POLICY_LOSSES",
    "AdvantageInputs",
    "aggregate",
    "approx_kl",
    "centering_term",
    "dynamic_filtering",
    "get_estimator",
    "get_policy_loss",
    "is_correction",
    "kl_loss",
    "masked_mean",
    "mismatch_metrics",
    "parse_threshold",
    "ppo_loss",
    "register_estimator",
    "register_policy_loss",
    "shape_rewards",
    "unit_token_counts",
    "value_loss",
    "whiten",
]
