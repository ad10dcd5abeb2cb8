"""The ``--algo.*``, ``--critic.*``, ``--reward.*`` flag groups of ``molt-train rl`` and every rule on the algorithm's flags.

``groups.py`` holds the shared groups (``adam`` among them) and ``commands.py`` the command configs; ``RLConfig``
calls ``validate_algo`` once its dependent defaults are filled. The rules refuse combinations that would silently
train the wrong thing (an estimator without what it reads, a loss mode with a knob it has no form for, an IS gate
that cannot be applied), each with a ``ConfigError`` naming the flags and saying what to do.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol

from molt_train.algorithms.estimators import ESTIMATORS
from molt_train.algorithms.is_correction import IS_GATINGS, IS_LEVELS, IS_MODES
from molt_train.algorithms.kl import KL_ESTIMATORS
from molt_train.config.flags import ConfigError, group, option
from molt_train.config.groups import ActorConfig, AdamConfig, DataConfig, RefConfig, RolloutConfig, TrainConfig

GROUP_ESTIMATORS = ("reinforce_baseline", "rloo", "grpo", "dr_grpo")


@dataclass(frozen=True)
class AdvantageConfig:
    """Rewards -> advantages, and the IS correction of the train/rollout mismatch."""

    estimator: str = option("reinforce", "advantage estimator", choices=ESTIMATORS)
    gamma: float = option(1.0, "discount (reinforce, gae)")
    lam: float = option(0.95, "GAE lambda (gae)")
    no_whiten: bool = option(False, "skip advantage whitening")
    is_correction_level: str = option("off", "IS correction granularity", choices=IS_LEVELS)
    is_correction_mode: str = option("mask", "what happens outside the band", choices=IS_MODES)
    is_correction_threshold: tuple[float, ...] = option(
        (0.5, 5.0), "[LOW] HIGH band on the IS ratio (gating binary_kl: one value, the KL bound)"
    )
    is_correction_gating: str = option(
        "ratio",
        "what a unit is gated on: ratio (its IS ratio against the band) | binary_kl (keep it iff its k3 KL "
        "estimate, summed over a seq / averaged for geo, is <= the threshold; needs mode mask)",
        choices=IS_GATINGS,
    )
    score_centering_top_k: int = option(
        0,
        "score centering: record the sampler's top-k log-probs per token and subtract its expected score from "
        "the policy loss (0 = off; hf engine; is_correction_level off or token)",
        minimum=0,
    )


@dataclass(frozen=True)
class KLConfig:
    """A KL penalty to the rollout policy or to a frozen reference."""

    init_coef: float = option(0.0, "KL coefficient beta (0 = no KL)", minimum=0)
    estimator: str = option("k1", "KL estimator", choices=KL_ESTIMATORS)
    use_loss: bool = option(False, "KL as a loss term instead of a per-token reward")
    ref: str = option(
        "rollout",
        "KL reference: rollout (the sampler's log-probs) | model (a frozen reference)",
        choices=("rollout", "model"),
    )


@dataclass(frozen=True)
class AlgoConfig:
    """The RL algorithm: advantages, KL, dynamic filtering."""

    advantage: AdvantageConfig = group(AdvantageConfig)
    kl: KLConfig = group(KLConfig)
    dynamic_filtering_enable: bool = option(False, "drop prompt groups whose mean score is outside the range")
    dynamic_filtering_range: tuple[float, float] = option((0.0, 1.0), "keep groups with LOW < mean score < HIGH")


@dataclass(frozen=True)
class CriticConfig:
    """The PPO critic of ``--algo.advantage.estimator gae``: its checkpoint, value-loss clip and optimizer."""

    model_name_or_path: str | None = option(None, "critic initialisation (default: the actor checkpoint)")
    value_clip: float | None = option(0.2, "clip V - V_old to +-this in the value loss (unset: no clip)", minimum=0)
    adam: AdamConfig = group(AdamConfig, lr=0.0)


@dataclass(frozen=True)
class RewardConfig:
    """Reward shaping before the estimator: a length penalty (at most one), then clipping."""

    clip_range: tuple[float, float] = option((-10.0, 10.0), "clip rewards to this range")
    overlong_buffer_len: int = option(
        0, "DAPO overlong penalty over the last N tokens of --data.max_len (0 = off)", minimum=0
    )
    overlong_penalty_factor: float = option(1.0, "maximum overlong penalty", minimum=0)
    stop_properly_penalty_coef: float | None = option(None, "truncated rollouts: reward*C (C in [0,1]) or C (C < 0)")


class AlgoRuleInputs(Protocol):
    """The groups the algorithm's rules read of a command config (``RLConfig`` has them all). A protocol, not
    ``RLConfig`` itself, so that this module stays below ``commands.py``, which calls it."""

    @property
    def actor(self) -> ActorConfig: ...
    @property
    def algo(self) -> AlgoConfig: ...
    @property
    def critic(self) -> CriticConfig: ...
    @property
    def data(self) -> DataConfig: ...
    @property
    def ref(self) -> RefConfig: ...
    @property
    def reward(self) -> RewardConfig: ...
    @property
    def rollout(self) -> RolloutConfig: ...
    @property
    def train(self) -> TrainConfig: ...


def algo_defaults(algo: AlgoConfig) -> AlgoConfig:
    """The dependent defaults: ``on_policy_distill`` makes the KL to the teacher the reward (``--algo.kl.ref model``,
    ``--algo.kl.init_coef`` 1.0 when left at 0)."""
    if algo.advantage.estimator != "on_policy_distill":
        return algo
    return replace(algo, kl=replace(algo.kl, ref="model", init_coef=algo.kl.init_coef or 1.0))


def validate_algo(cfg: AlgoRuleInputs) -> None:
    """Every rule on ``--algo.*``, ``--reward.*`` and the policy loss's ``--actor.*`` flags; raises ``ConfigError``."""
    n = cfg.rollout.n_samples_per_prompt
    adv, algo = cfg.algo.advantage, cfg.algo
    if adv.estimator in GROUP_ESTIMATORS and n < 2:
        raise ConfigError(
            f"--algo.advantage.estimator {adv.estimator} compares samples of one prompt and needs "
            f"--rollout.n_samples_per_prompt > 1, got {n}"
        )
    if algo.dynamic_filtering_enable and n < 2:
        raise ConfigError(f"--algo.dynamic_filtering_enable needs --rollout.n_samples_per_prompt > 1, got {n}")
    low, high = algo.dynamic_filtering_range
    if not low < high:
        raise ConfigError(f"--algo.dynamic_filtering_range must be LOW HIGH with LOW < HIGH, got {low} {high}")
    if not 0 < adv.gamma <= 1:
        raise ConfigError(f"--algo.advantage.gamma must be in (0, 1], got {adv.gamma}")
    _validate_loss_mode(cfg)
    if adv.estimator == "on_policy_distill":
        _validate_distill(cfg)
    if not 0 <= adv.lam <= 1:
        raise ConfigError(f"--algo.advantage.lam must be in [0, 1], got {adv.lam}")
    critic_set = cfg.critic.adam.lr > 0 or cfg.critic.model_name_or_path is not None
    if adv.estimator == "gae" and cfg.critic.adam.lr <= 0:
        raise ConfigError(
            "--algo.advantage.estimator gae trains a critic with its own optimizer: pass --critic.adam.lr "
            "(e.g. 5e-6; a value head learns faster than the policy)"
        )
    if adv.estimator != "gae" and critic_set:
        raise ConfigError(
            f"--critic.* configures the PPO critic, which only --algo.advantage.estimator gae builds (got "
            f"{adv.estimator}); drop the --critic flags or use gae"
        )
    _validate_is_correction(cfg)
    _validate_flash_reinforce(cfg)
    _validate_reward(cfg.reward, cfg.data.max_len)
    if algo.kl.init_coef > 0 and algo.kl.ref == "rollout" and cfg.rollout.top_p < 1:
        raise ConfigError(
            f"--algo.kl.ref rollout reads the sampler's log-probs, which --rollout.top_p "
            f"{cfg.rollout.top_p} renormalises away; use --rollout.top_p 1.0 or --algo.kl.ref model"
        )


def _validate_flash_reinforce(cfg: AlgoRuleInputs) -> None:
    """FlashREINFORCE (``flash_reinforce``: one rollout per prompt, the batch-mean baseline) and
    ``--train.force_on_policy`` (one optimizer step per fresh rollout batch, never replayed; pi_old = pi)."""
    adv, train, n = cfg.algo.advantage, cfg.train, cfg.rollout.n_samples_per_prompt
    if adv.estimator == "flash_reinforce":
        if n != 1:
            raise ConfigError(
                f"--algo.advantage.estimator flash_reinforce is single-rollout (one sample per prompt, the batch "
                f"mean its baseline), got --rollout.n_samples_per_prompt {n}; use 1, or a group estimator "
                "(grpo, rloo, reinforce_baseline, dr_grpo) for several samples per prompt"
            )
        if not train.force_on_policy:
            raise ConfigError(
                "--algo.advantage.estimator flash_reinforce takes one optimizer step per fresh rollout batch: pass "
                "--train.force_on_policy"
            )
    rows = cfg.rollout.batch_size * n  # (--train.max_epochs > 1 and overlap are refused in commands.py)
    if train.force_on_policy and train.batch_size and train.batch_size < rows:
        raise ConfigError(
            f"--train.force_on_policy takes one optimizer step over the whole rollout batch ({rows} rows: "
            f"--rollout.batch_size x --rollout.n_samples_per_prompt); --train.batch_size {train.batch_size} would "
            "split it into several: use --train.batch_size 0 (the whole batch) or the batch's row count"
        )


def _validate_distill(cfg: AlgoRuleInputs) -> None:
    kl = cfg.algo.kl
    if cfg.ref.model_name_or_path is None:
        raise ConfigError(
            "--algo.advantage.estimator on_policy_distill distils toward a teacher: pass --ref.model_name_or_path "
            "TEACHER (a checkpoint with the student's tokenizer)"
        )
    if kl.estimator != "k1" or kl.use_loss:
        raise ConfigError(
            "--algo.advantage.estimator on_policy_distill makes the per-token k1 reverse KL its advantage: drop "
            f"--algo.kl.estimator {kl.estimator} / --algo.kl.use_loss (got use_loss={kl.use_loss})"
        )


def check_teacher_tokenizer(student_path: str, teacher_path: str) -> None:
    """Refuse a distillation teacher whose tokenizer differs from the student's: the per-token log-probs would
    compare different tokens. Raises ``ConfigError`` naming ``--ref.model_name_or_path``."""
    from transformers import AutoTokenizer

    student, teacher = AutoTokenizer.from_pretrained(student_path), AutoTokenizer.from_pretrained(teacher_path)
    same = (
        student.get_vocab() == teacher.get_vocab()
        and student.all_special_tokens == teacher.all_special_tokens
        and student.chat_template == teacher.chat_template
    )
    if not same:
        raise ConfigError(
            f"--ref.model_name_or_path {teacher_path}: the teacher's tokenizer differs from the student's "
            f"(--actor.model_name_or_path {student_path}); on_policy_distill compares per-token log-probs, so the "
            "teacher must share the student's tokenizer (vocabulary, special tokens, chat template)"
        )


def _validate_loss_mode(cfg: AlgoRuleInputs) -> None:
    actor = cfg.actor
    low, high = actor.eps_clip_low_high
    if low < 0 or high < 0:
        raise ConfigError(f"--actor.eps_clip_low_high must be >= 0, got {low} {high}")
    if actor.dual_clip is not None and actor.dual_clip <= 1:
        raise ConfigError(f"--actor.dual_clip must be > 1 (recipes use 10), got {actor.dual_clip}")
    if actor.loss_mode != "ppo" and actor.dual_clip is not None:
        raise ConfigError(
            f"--actor.dual_clip bounds PPO's per-token ratio; --actor.loss_mode {actor.loss_mode} has no dual clip: "
            "drop --actor.dual_clip or use --actor.loss_mode ppo"
        )
    if actor.loss_mode == "cispo" and high < 1:
        raise ConfigError(
            f"--actor.loss_mode cispo reads the second value of --actor.eps_clip_low_high as an absolute ceiling "
            f"on the IS weight, which must be >= 1, got {high}; pass e.g. --actor.eps_clip_low_high 0.2 1.2"
        )


def _validate_is_correction(cfg: AlgoRuleInputs) -> None:
    """Refuse IS-correction settings that would silently train on biased updates."""
    adv, train = cfg.algo.advantage, cfg.train
    level, mode = adv.is_correction_level, adv.is_correction_mode
    if level in ("seq", "geo") and mode != "mask":
        raise ConfigError(
            f"--algo.advantage.is_correction_level {level!r} is a sequence rejection filter and needs "
            f"--algo.advantage.is_correction_mode 'mask', got {mode!r}; use level 'token' for clip/trunc"
        )
    queue = 0 if train.on_policy else train.async_queue_size
    if level == "off" and (queue > 1 or train.partial_rollout_enable):
        raise ConfigError(
            f"async rollout (--train.async_queue_size={queue}, "
            f"--train.partial_rollout_enable={train.partial_rollout_enable}) trains on off-policy samples; "
            "enable --algo.advantage.is_correction_level (e.g. geo) or use --train.async_queue_size 1 without "
            "partial rollout"
        )
    if level != "off" and cfg.rollout.top_p < 1.0:
        raise ConfigError(
            f"IS correction needs --rollout.top_p 1.0, got {cfg.rollout.top_p}: nucleus renormalisation "
            "biases the rollout log-probs; set --rollout.top_p 1.0 or --algo.advantage.is_correction_level off"
        )
    band = adv.is_correction_threshold
    if adv.is_correction_gating == "binary_kl" and (level == "off" or mode != "mask" or len(band) != 1):
        raise ConfigError(
            "--algo.advantage.is_correction_gating binary_kl keeps or drops units on their KL: it needs "
            "--algo.advantage.is_correction_level token/seq/geo, --algo.advantage.is_correction_mode mask and "
            "one --algo.advantage.is_correction_threshold value, the KL bound (e.g. 5e-3); got level "
            f"{level!r}, mode {mode!r}, threshold {' '.join(map(str, band))}"
        )
    _validate_score_centering(cfg)
    low, high = (0.0, *band) if len(band) == 1 else (band if len(band) == 2 else (None, None))
    if low is None or not 0.0 <= low < high:
        raise ConfigError(
            f"--algo.advantage.is_correction_threshold must be HIGH or LOW HIGH with 0 <= LOW < HIGH, got "
            f"{' '.join(map(str, band))} (recipes use 0.99 1.01)"
        )


def _validate_score_centering(cfg: AlgoRuleInputs) -> None:
    adv, k = cfg.algo.advantage, cfg.algo.advantage.score_centering_top_k
    if not k:
        return
    if adv.is_correction_level in ("seq", "geo"):
        raise ConfigError(
            f"--algo.advantage.score_centering_top_k cannot be stacked on the sequence gate "
            f"--algo.advantage.is_correction_level {adv.is_correction_level}: a sequence gate has no per-candidate "
            "form (and with its exact ratio the centering term is zero); use level off or token"
        )
    if cfg.rollout.engine != "hf":
        raise ConfigError(
            "--algo.advantage.score_centering_top_k needs the sampler's top-k log-probs, which only "
            "--rollout.engine hf records here; use --rollout.engine hf"
        )
    if cfg.actor.loss_mode != "ppo":
        raise ConfigError(
            f"--algo.advantage.score_centering_top_k centers the REINFORCE/PPO score; --actor.loss_mode "
            f"{cfg.actor.loss_mode} has no centered form: use --actor.loss_mode ppo"
        )
    if cfg.rollout.top_p < 1 or cfg.rollout.top_k != -1:
        raise ConfigError(
            f"--algo.advantage.score_centering_top_k weighs candidates by the sampler's distribution, which "
            f"--rollout.top_p {cfg.rollout.top_p} / --rollout.top_k {cfg.rollout.top_k} truncate; use "
            "--rollout.top_p 1.0 --rollout.top_k -1"
        )


def _validate_reward(reward: RewardConfig, max_len: int) -> None:
    low, high = reward.clip_range
    if not low <= high:
        raise ConfigError(f"--reward.clip_range must be LOW HIGH with LOW <= HIGH, got {low} {high}")
    coef = reward.stop_properly_penalty_coef
    if reward.overlong_buffer_len and coef is not None:
        raise ConfigError(
            f"--reward.overlong_buffer_len {reward.overlong_buffer_len} and --reward.stop_properly_penalty_coef "
            f"{coef} are mutually exclusive length penalties; keep one"
        )
    if reward.overlong_buffer_len >= max_len:
        raise ConfigError(
            f"--reward.overlong_buffer_len {reward.overlong_buffer_len} must be shorter than --data.max_len {max_len}"
        )
    if coef is not None and coef > 1:
        raise ConfigError(f"--reward.stop_properly_penalty_coef must be in [0, 1] (scale) or < 0 (replace), got {coef}")
