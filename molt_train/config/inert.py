"""No silent flag: a flag given a value (one other than its default) in a run where nothing reads it is refused.

Each ``Inert`` rule names flags, the commands it applies to, the condition under which those flags have no effect,
why, and what would make them act. ``check_inert`` runs when a command config is built, before its dependent
defaults are filled, so it sees what the command line (or the code) gave. The refusal is a ``ConfigError``: the
command line exits 2 with ``--FLAG ... has no effect: WHY; FIX``.

The flags that always act (every run reads them) have no rule; ``tests/molt_train/test_no_silent_flags.py`` lists
every flag of every command as either covered by a rule here or always read, so a new flag cannot be forgotten.
No flag is only warned about: every case found so far is refused.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from molt_train.config import flags
from molt_train.config.flags import ConfigError

RL, SFT, EVAL = ("rl",), ("sft",), ("eval",)
TRAINING = ("rl", "sft")

DISCOUNTED = ("reinforce", "gae")  # the estimators that read --algo.advantage.gamma
WHITENED = ("reinforce", "reinforce_baseline", "gae")  # the estimators that whiten (--algo.advantage.no_whiten)
SHAPE_FLAGS = tuple(
    f"model.{name}"
    for name in (
        "hidden_size",
        "num_layers",
        "num_heads",
        "intermediate_size",
        "vocab_size",
        "image_size",
        "patch_size",
        "role_tokens",
    )
)
# what --eval.eval_only reads (molt_train/eval_only.py: the rollout actor, its engine and the eval); every other flag
# of rl trains, and --ckpt.load_enable / --train.rollout_*_dir have their own refusals in commands.py
EVAL_ONLY_READS = (
    "env",
    "ray.",
    "actor.model_name_or_path",
    "actor.num_threads",
    "data.input_key",
    "data.label_key",
    "data.image_key",
    "data.max_len",
    "rollout.engine",
    "rollout.max_new_tokens",
    "rollout.top_p",  # --eval.top_p's fallback
    "rollout.timeout_s",
    "rollout.max_batch_size",
    "vllm.",
    "train.agent_path",
    "train.seed",
    "train.rollout_dump_dir",
    "train.rollout_replay_dir",
    "ckpt.output_dir",
    "ckpt.load_enable",
    "eval.",
    "logger.",
    "judge.",
)


@dataclass(frozen=True)
class Inert:
    """``names`` (dotted names; one ending in "." is a whole group) have no effect in ``commands`` when ``when(cfg)``:
    ``why`` says so, ``fix`` what would make them act."""

    names: tuple[str, ...]
    commands: tuple[str, ...]
    when: Callable[[Any], bool]
    why: str
    fix: str
    unless: tuple[str, ...] = ()  # names (or groups) the rule leaves alone
    example: tuple[str, ...] = ()  # flags that make ``when`` hold in a plain run (the no-silent-flag test's)
    warn: bool = False  # warn once and record it in the run's config.json instead of refusing (WARNED)

    def covers(self, name: str, command: str) -> bool:
        return command in self.commands and _matches(name, self.names) and not _matches(name, self.unless)


def _matches(name: str, names: tuple[str, ...]) -> bool:
    return any(n in ("", name) or (n.endswith(".") and name.startswith(n)) for n in names)


def _no_reference(cfg: Any) -> bool:
    return cfg.algo.kl.ref != "model" and cfg.algo.advantage.estimator != "on_policy_distill"


def _no_cuda(cfg: Any) -> bool:
    """No CUDA device is visible and no cluster is joined (routing replay refuses --actor.compile by its own rule)."""
    import torch

    return cfg.ray.address is None and cfg.train.routing is None and not torch.cuda.is_available()


RULES: tuple[Inert, ...] = (
    Inert(
        ("vllm.",),
        RL,
        lambda c: c.rollout.engine != "vllm",
        "it configures the vllm engine, and this run generates with the hf engine",
        "add --rollout.engine vllm (a CUDA GPU and vLLM)",
    ),
    Inert(
        ("vllm.compile",),
        RL,
        lambda c: c.vllm.enforce_eager,
        "--vllm.enforce_eager already turns off both compilation and CUDA graphs",
        "drop --vllm.enforce_eager (full decode graphs without compilation), or drop it",
        example=("--rollout.engine", "vllm", "--vllm.enforce_eager"),
    ),
    Inert(
        ("rollout.max_batch_size",),
        RL,
        lambda c: c.rollout.engine == "vllm" and not c.judge.model_name_or_path,
        "it sizes the hf engine's decode batches, and --rollout.engine vllm schedules its own",
        "use --vllm.max_num_seqs, or --rollout.engine hf",
        example=("--rollout.engine", "vllm"),
    ),
    Inert(
        ("algo.advantage.gamma",),
        RL,
        lambda c: c.algo.advantage.estimator not in DISCOUNTED,
        "only the reinforce and gae estimators discount",
        "use --algo.advantage.estimator reinforce or gae, or drop it",
        example=("--algo.advantage.estimator", "rloo"),
    ),
    Inert(
        ("algo.advantage.lam",),
        RL,
        lambda c: c.algo.advantage.estimator != "gae",
        "GAE's lambda is read by the gae estimator only",
        "use --algo.advantage.estimator gae (with --critic.adam.lr), or drop it",
    ),
    Inert(
        ("algo.advantage.no_whiten",),
        RL,
        lambda c: c.algo.advantage.estimator not in WHITENED,
        f"only the {', '.join(WHITENED)} estimators whiten their advantages",
        f"use --algo.advantage.estimator {' / '.join(WHITENED)}, or drop it",
        example=("--algo.advantage.estimator", "grpo"),
    ),
    Inert(
        ("algo.advantage.is_correction_mode", "algo.advantage.is_correction_threshold"),
        RL,
        lambda c: c.algo.advantage.is_correction_level == "off",
        "the IS correction is off",
        "add --algo.advantage.is_correction_level token / seq / geo",
    ),
    Inert(
        ("algo.kl.estimator", "algo.kl.use_loss", "algo.kl.ref"),
        RL,
        lambda c: c.algo.kl.init_coef == 0 and c.algo.advantage.estimator != "on_policy_distill",
        "there is no KL term (--algo.kl.init_coef 0)",
        "add --algo.kl.init_coef BETA",
    ),
    Inert(
        ("ref.",),
        RL,
        _no_reference,
        "no reference model is built (the KL reference is the rollout policy)",
        "add --algo.kl.ref model --algo.kl.init_coef BETA (or --algo.advantage.estimator on_policy_distill)",
    ),
    Inert(
        ("train.colocate_fsdp_models",),
        RL,
        lambda c: _no_reference(c) and not c.train.colocate_all,  # with colocate_all: refused in commands.py
        "it places the reference ranks, and no reference model is built",
        "add --algo.kl.ref model --algo.kl.init_coef BETA",
    ),
    Inert(
        ("algo.dynamic_filtering_range",),
        RL,
        lambda c: not c.algo.dynamic_filtering_enable,
        "dynamic filtering is off",
        "add --algo.dynamic_filtering_enable",
    ),
    Inert(
        ("critic.",),
        RL,
        lambda c: c.algo.advantage.estimator != "gae",
        "it configures the PPO critic, which only --algo.advantage.estimator gae builds",
        "use --algo.advantage.estimator gae, or drop the --critic flags",
    ),
    Inert(
        ("reward.overlong_penalty_factor",),
        RL,
        lambda c: c.reward.overlong_buffer_len == 0,
        "the overlong penalty is off (--reward.overlong_buffer_len 0)",
        "add --reward.overlong_buffer_len N",
    ),
    Inert(
        ("judge.timeout_s", "judge.max_new_tokens"),
        RL,
        lambda c: not c.judge.enabled,
        "no judge is served",
        "add --judge.policy or --judge.model_name_or_path DIR",
    ),
    Inert(
        ("actor.min_lr_ratio",),
        TRAINING,
        lambda c: c.actor.lr_scheduler != "cosine",
        "it is the cosine schedule's floor, and the schedule is constant",
        "add --actor.lr_scheduler cosine",
    ),
    Inert(
        ("actor.compile",),
        TRAINING,
        _no_cuda,
        "it compiles the GPU training step, and no CUDA device is visible here (the CPU trains eagerly)",
        "run on a CUDA GPU (or join a cluster with --ray.address)",
    ),
    Inert(
        ("model.lora_alpha",),
        TRAINING,
        lambda c: c.model.lora_dim == 0,
        "LoRA is off (--model.lora_dim 0)",
        "add --model.lora_dim RANK",
    ),
    Inert(
        ("ray.num_cpus",),
        TRAINING,
        lambda c: c.ray.address is not None,
        "it sizes a local Ray instance, and --ray.address joins a cluster",
        "drop --ray.address, or drop it",
        example=("--ray.address", "auto"),
    ),
    Inert(
        ("data.input_key", "data.label_key", "data.image_key"),
        TRAINING,
        lambda c: c.data.prompt_dataset is None and c.eval.dataset is None,
        "it names a field of JSONL rows, and the rows come from the env",
        "add --data.prompt_dataset FILE (or --eval.dataset FILE)",
    ),
    Inert(
        ("data.output_key",),
        SFT,
        lambda c: c.data.prompt_dataset is None,
        "it names a field of --data.prompt_dataset rows, and the rows come from the env",
        "add --data.prompt_dataset FILE",
    ),
    Inert(
        ("data.split",),
        TRAINING,
        lambda c: c.data.prompt_dataset is not None,
        "--data.prompt_dataset replaces the env's split",
        "drop --data.prompt_dataset, or drop it",
        example=("--data.prompt_dataset", "rows.jsonl"),
    ),
    Inert(
        ("eval.split",),
        ("rl", "sft", "eval"),
        lambda c: c.eval.dataset is not None,
        "--eval.dataset replaces the env's split",
        "drop --eval.dataset, or drop it",
        example=("--eval.dataset", "rows.jsonl"),
    ),
    Inert(
        ("ckpt.max_num", "ckpt.save_hf"),
        TRAINING,
        lambda c: c.ckpt.save_steps == 0,
        "it acts on the --ckpt.save_steps checkpoints, and only the final model is saved",
        "add --ckpt.save_steps N",
    ),
    Inert(
        ("logger.wandb_run_name",),
        TRAINING,
        lambda c: c.logger.wandb_project is None,
        "nothing is logged to W&B",
        "add --logger.wandb_project P",
    ),
    Inert(
        SHAPE_FLAGS,
        SFT,
        lambda c: c.model.config is None,
        "it shapes a model built from scratch, and --actor.model_name_or_path keeps its checkpoint's",
        "use --model.config tiny|tiny-vl instead of a checkpoint, or drop it",
    ),
    Inert(
        ("model.image_size", "model.patch_size"),
        SFT,
        lambda c: c.model.config == "tiny",
        "--model.config tiny has no vision tower",
        "use --model.config tiny-vl",
        example=("--model.config", "tiny"),
    ),
    Inert(
        ("eval.",),
        RL,
        lambda c: not c.eval.eval_only and (c.eval.max_samples == 0 or (not c.env and c.eval.dataset is None)),
        "the run evaluates nothing (--eval.max_samples 0, or no --env split and no --eval.dataset)",
        "give the eval rows (--env ID or --eval.dataset FILE, --eval.max_samples N > 0)",
        unless=("eval.max_samples", "eval.eval_only", "eval.dataset"),
        example=("--eval.max_samples", "0"),
    ),
    Inert(
        ("eval.", "rollout."),
        SFT,
        lambda c: c.eval.max_samples == 0,
        "--eval.max_samples 0 skips the final eval",
        "drop --eval.max_samples 0",
        example=("--eval.max_samples", "0"),
        unless=("eval.max_samples",),
    ),
    Inert(
        ("",),  # every flag but what the eval reads
        RL,
        lambda c: c.eval.eval_only,
        "--eval.eval_only scores the checkpoint and trains nothing",
        "drop --eval.eval_only to train, or drop it",
        example=("--eval.eval_only",),
        unless=EVAL_ONLY_READS,
        warn=True,  # refusing would break `<training command> --eval.eval_only`, the common way to score its model
    ),
)
WARNED = tuple(rule for rule in RULES if rule.warn)  # the exceptions: few, and listed here
_warned: set[str] = set()


def check_inert(cfg: Any, command: str) -> None:
    """Refuse the first flag given a non-default value that no part of ``command``'s run reads; raises
    ``ConfigError`` naming it, why it has no effect and what would make it act. The ``WARNED`` cases are logged
    once instead (``inert_warnings`` gives them for the run's config.json)."""
    for message in inert_warnings(cfg, command, refuse=True):
        if message not in _warned:
            _warned.add(message)
            logging.getLogger(__name__).warning(message)


def inert_warnings(cfg: Any, command: str, refuse: bool = False) -> list[str]:
    """The messages of the flags of ``cfg`` that have no effect under a ``warn`` rule; ``refuse``: raise
    ``ConfigError`` for one under any other rule."""
    out = []
    for flag in flags.flags(type(cfg), command):
        value = functools.reduce(getattr, flag.name.split("."), cfg)
        if _plain(value) == _plain(flag.default):
            continue
        for rule in RULES:
            if rule.covers(flag.name, command) and rule.when(cfg):
                message = f"--{flag.name} {_shown(value)} has no effect: {rule.why}; {rule.fix}"
                if not rule.warn and refuse:
                    raise ConfigError(message)
                if rule.warn:
                    out.append(message)
                break
    return out


def rules_for(name: str, command: str) -> list[Inert]:
    """The rules that cover the flag ``name`` of ``command`` (the no-silent-flag test reads them)."""
    return [rule for rule in RULES if rule.covers(name, command)]


def _plain(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def _shown(value: Any) -> str:
    return " ".join(map(str, value)) if isinstance(value, tuple | list) else str(value)
