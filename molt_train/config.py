"""Dotted CLI flags (``--actor.adam.lr 1e-3``) parsed with argparse into nested namespaces (``cfg.actor.adam.lr``).

One table per command lists its flags; ``parse`` builds the parser, turns the dots into nesting, fills dependent
defaults and refuses combinations that would silently train the wrong thing, with an error naming the flags.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
from collections.abc import Sequence
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

from molt_train.actor_backend import AUTOMODEL_INSTALL_HINT, BACKENDS
from molt_train.algorithms import (
    ESTIMATORS,
    IS_LEVELS,
    IS_MODES,
    KL_ESTIMATORS,
    LOSS_AGG_MODES,
    POLICY_LOSSES,
    RewardShaping,
    validate_is_config,
)
from molt_train.engines.vllm import VLLM_FLAGS, VLLM_INSTALL_HINT, VLLMOptions

GROUP_ESTIMATORS = ("reinforce_baseline", "rloo", "grpo", "dr_grpo")

# (flag, type, default, help); type bool = a switch, a tuple type = (element type, nargs)
_Flag = tuple[str, Any, Any, str]

MODEL_FLAGS: list[_Flag] = [
    ("--model.config", str, None, "build a model from scratch: 'tiny' (tokenizer trained on the env's train split)"),
    ("--model.hidden_size", int, 64, "tiny model width"),
    ("--model.num_layers", int, 2, "tiny model depth"),
    ("--model.num_heads", int, 4, "tiny model attention heads"),
    ("--model.intermediate_size", int, 0, "tiny model MLP width (0 = 4 x hidden_size)"),
    ("--model.vocab_size", int, 512, "tiny tokenizer vocabulary (byte-level BPE, one token per digit)"),
]

COMMON_FLAGS: list[_Flag] = [
    ("--env", str, None, "registered env ID (ns/name-vN); its train split gives prompts and labels"),
    ("--ray.address", str, None, "join this Ray cluster; default: start a local instance"),
    ("--ray.num_cpus", int, None, "CPUs of the local Ray instance (default: all)"),
    ("--actor.model_name_or_path", str, None, "HF checkpoint directory of the policy"),
    ("--actor.num_workers", int, 1, "FSDP2 trainer processes (gloo on CPU, NCCL on GPU)"),
    (
        "--actor.backend",
        str,
        "hf",
        f"policy model library, one of {BACKENDS}: hf (transformers) | automodel "
        "(NeMo AutoModel; needs CUDA and nemo_automodel)",
    ),
    ("--actor.freeze_moe_router", bool, False, "keep MoE router weights at their checkpoint values (MoE models only)"),
    ("--actor.adam.lr", float, 1e-6, "AdamW learning rate"),
    ("--actor.adam.betas", (float, 2), (0.9, 0.95), "AdamW betas"),
    ("--actor.adam.eps", float, 1e-8, "AdamW eps"),
    ("--actor.adam.weight_decay", float, 0.0, "AdamW weight decay"),
    ("--actor.lr_warmup_ratio", float, 0.0, "linear LR warm-up over this fraction of the optimizer steps"),
    ("--actor.lr_scheduler", str, "constant", "after warm-up: constant | cosine (decay to --actor.min_lr_ratio)"),
    ("--actor.min_lr_ratio", float, 0.0, "cosine schedule floor, as a fraction of the learning rate"),
    ("--actor.max_norm", float, 1.0, "gradient clipping norm (0 = off)"),
    ("--actor.logprob_chunk_size", int, 1024, "positions per log-prob chunk (bounds the fp32 vocab logits alive)"),
    ("--actor.gradient_checkpoint", bool, False, "recompute decoder layers in backward"),
    (
        "--actor.param_dtype",
        str,
        "bfloat16",
        "GPU compute dtype: FSDP2 mixed precision over fp32 master weights "
        "(bfloat16 | float32); CPU always computes in float32",
    ),
    (
        "--actor.compile",
        bool,
        False,
        "torch.compile each decoder layer and the log-prob chunk (GPU: 48 percent training "
        "MFU at 0.6B on an H200, 2.3x eager; the first step pays ~1 min compiling)",
    ),
    (
        "--actor.num_threads",
        int,
        0,
        "torch CPU threads per trainer process (0 = the host's cores / concurrent processes)",
    ),
    ("--data.prompt_dataset", str, None, "JSONL file of prompts, overriding the env's train split"),
    ("--data.input_key", str, "input", "prompt field of --data.prompt_dataset rows"),
    ("--data.label_key", str, "label", "label field of --data.prompt_dataset rows"),
    ("--data.output_key", str, "output", "reference completion field of --data.prompt_dataset rows (SFT)"),
    ("--data.split", str, "train", "env split to train on"),
    ("--data.max_samples", int, None, "use at most this many rows"),
    ("--data.max_len", int, 1024, "total context (prompt + generated) in tokens"),
    ("--train.seed", int, 42, "seed for data order, sampling and init"),
    ("--train.micro_batch_size", int, 64, "rows per micro-batch at most"),
    ("--train.max_tokens_per_gpu", int, 8192, "padded tokens per micro-batch at most (token budget)"),
    ("--ckpt.output_dir", str, None, "run directory: metrics, checkpoints, hf/ (the final model)"),
    ("--ckpt.save_steps", int, 0, "save a resumable checkpoint every N steps (0 = only at the end)"),
    ("--ckpt.max_num", int, 2, "resumable checkpoints kept"),
    ("--ckpt.load_enable", bool, False, "resume from the latest checkpoint in --ckpt.output_dir"),
    ("--eval.split", str, "test", "held-out split for evaluation"),
    ("--eval.steps", int, 0, "evaluate every N steps (0 = only at the end)"),
    ("--eval.max_samples", int, None, "evaluate on at most this many rows (sft: 0 skips the final eval)"),
    ("--eval.max_new_tokens", int, None, "generation budget at eval (default: the rollout's)"),
    ("--eval.temperature", float, 0.0, "eval sampling temperature (0 = greedy)"),
    ("--eval.eval_at_start", bool, False, "evaluate before the first step"),
    ("--logger.progress", bool, True, "rich progress bar on the console"),
]

RL_FLAGS: list[_Flag] = [
    ("--train.agent_path", str, None, "agent .py exporting AgentRunner (overrides the env's runner)"),
    ("--train.num_steps", int, 20, "optimizer-step rounds (one rollout batch each)"),
    ("--train.batch_size", int, 0, "samples per optimizer step (0 = the whole rollout batch)"),
    ("--train.max_epochs", int, 1, "passes over each rollout batch"),
    ("--train.async_queue_size", int, 1, "rollout batches in flight ahead of training (rollout k+1 overlaps step k)"),
    ("--train.force_sync_mode", bool, False, "strictly on-policy: the next rollout starts only after the weight sync"),
    (
        "--train.partial_rollout_enable",
        bool,
        False,
        "sync weights while rollouts are in flight: the vllm engine "
        "pauses them, loads, and resumes on the new weights (needs IS correction)",
    ),
    (
        "--train.colocate_all",
        bool,
        False,
        "trainer ranks, reference and rollout engine share the GPU (fractional Ray "
        "GPUs); the vllm engine then syncs by CUDA IPC. Without it, --rollout.engine "
        "vllm gets GPUs of its own and syncs by NCCL broadcast",
    ),
    (
        "--actor.num_gpus_per_node",
        int,
        0,
        "GPUs for the trainer (one FSDP2 rank each; sets --actor.num_workers); 0 = --actor.num_workers",
    ),
    (
        "--train.check_weight_update_equal",
        bool,
        False,
        "after every weight sync compare each engine parameter with "
        "the trainer's; a stale or unreached one stops the run, named",
    ),
    (
        "--rollout.engine",
        str,
        "hf",
        "rollout engine: hf (transformers; CPU or GPU) | vllm (CUDA; colocated with "
        "--train.colocate_all, else on GPUs of its own)",
    ),
    ("--rollout.batch_size", int, 16, "prompts per rollout batch"),
    ("--rollout.n_samples_per_prompt", int, 1, "samples per prompt (a group)"),
    ("--rollout.max_new_tokens", int, 256, "generated tokens per turn at most"),
    ("--rollout.temperature", float, 1.0, "sampling temperature"),
    ("--rollout.top_p", float, 1.0, "nucleus sampling"),
    ("--rollout.top_k", int, -1, "top-k sampling (-1 = off)"),
    ("--rollout.timeout_s", float, 600.0, "an episode running longer is dropped as 'timeout'"),
    ("--rollout.max_batch_size", int, 256, "sequences the hf engine decodes together"),
    ("--actor.loss_mode", str, "ppo", f"policy loss: {sorted(POLICY_LOSSES)}"),
    ("--actor.eps_clip_low_high", (float, 2), (0.2, 0.2), "PPO clip range below/above 1"),
    ("--actor.dual_clip", float, None, "dual-clip bound c > 1 for negative advantages (off by default)"),
    ("--actor.loss_agg_mode", str, "token-mean", f"one of {LOSS_AGG_MODES}"),
    ("--algo.advantage.estimator", str, "reinforce", f"one of {sorted(ESTIMATORS)}"),
    ("--algo.advantage.gamma", float, 1.0, "discount (reinforce)"),
    ("--algo.advantage.no_whiten", bool, False, "skip advantage whitening"),
    ("--algo.advantage.is_correction_level", str, "off", f"one of {IS_LEVELS}"),
    ("--algo.advantage.is_correction_mode", str, "mask", f"one of {IS_MODES}"),
    ("--algo.advantage.is_correction_threshold", (float, "+"), (0.5, 5.0), "[LOW] HIGH band on the IS ratio"),
    ("--algo.kl.init_coef", float, 0.0, "KL coefficient beta (0 = no KL)"),
    ("--algo.kl.estimator", str, "k1", f"one of {KL_ESTIMATORS}"),
    ("--algo.kl.use_loss", bool, False, "KL as a loss term instead of a reward"),
    ("--algo.kl.ref", str, "rollout", "KL reference: rollout (the sampler's log-probs) | model (a frozen reference)"),
    ("--ref.model_name_or_path", str, None, "frozen reference model (default: the actor checkpoint)"),
    ("--algo.dynamic_filtering_enable", bool, False, "drop prompt groups whose mean score is outside the range"),
    ("--algo.dynamic_filtering_range", (float, 2), (0.0, 1.0), "keep groups with LOW < mean score < HIGH"),
    ("--reward.clip_range", (float, 2), (-10.0, 10.0), "clip rewards to this range"),
    ("--reward.overlong_buffer_len", int, 0, "DAPO overlong penalty over the last N tokens of --data.max_len"),
    ("--reward.overlong_penalty_factor", float, 1.0, "maximum overlong penalty"),
    ("--reward.stop_properly_penalty_coef", float, None, "truncated rollouts: reward*C (C in [0,1]) or C (C < 0)"),
]

SFT_FLAGS: list[_Flag] = [
    ("--train.num_steps", int, 200, "optimizer steps"),
    ("--train.batch_size", int, 64, "rows per optimizer step"),
]

EVAL_FLAGS: list[_Flag] = [
    ("--rollout.max_new_tokens", int, 256, "generated tokens per turn at most"),
    ("--rollout.max_batch_size", int, 256, "sequences the hf engine decodes together"),
    ("--rollout.timeout_s", float, 600.0, "an episode running longer is dropped as 'timeout'"),
    ("--train.agent_path", str, None, "agent .py exporting AgentRunner (overrides the env's runner)"),
]

COMMAND_FLAGS = {
    "rl": COMMON_FLAGS + RL_FLAGS + VLLM_FLAGS,
    "sft": COMMON_FLAGS + MODEL_FLAGS + SFT_FLAGS + EVAL_FLAGS,
    "eval": COMMON_FLAGS + EVAL_FLAGS,
}


class ConfigError(ValueError):
    """A flag value or combination the trainer refuses; the message names the flags and what to do."""


def build_parser(command: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"molt-train {command}", allow_abbrev=False)
    for flag, kind, default, help_ in COMMAND_FLAGS[command]:
        if kind is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default, help=help_)
        elif isinstance(kind, tuple):
            parser.add_argument(flag, type=kind[0], nargs=kind[1], default=default, help=help_)
        else:
            parser.add_argument(flag, type=kind, default=default, help=help_)
    return parser


def hierarchize(flat: dict[str, Any]) -> SimpleNamespace:
    """``{"actor.adam.lr": 1e-3}`` -> ``ns.actor.adam.lr``."""
    root = SimpleNamespace()
    for dotted, value in flat.items():
        node = root
        *parents, leaf = dotted.split(".")
        for part in parents:
            if not hasattr(node, part):
                setattr(node, part, SimpleNamespace())
            node = getattr(node, part)
        setattr(node, leaf, tuple(value) if isinstance(value, list) else value)
    return root


def parse(command: str, argv: Sequence[str] | None) -> SimpleNamespace:
    """Parse and validate; a refused value exits with status 2 and a message naming the flag."""
    parser = build_parser(command)
    cfg = hierarchize(vars(parser.parse_args(argv)))
    try:
        {"rl": validate_rl, "sft": validate_sft, "eval": validate_eval}[command](cfg)
        if command != "eval":
            require_installed(cfg)
    except ConfigError as exc:
        parser.error(str(exc))
    return cfg


def to_dict(ns: Any) -> Any:
    """Nested namespaces back to plain dicts (for run metadata)."""
    if isinstance(ns, SimpleNamespace):
        return {k: to_dict(v) for k, v in vars(ns).items()}
    return list(ns) if isinstance(ns, tuple) else ns


def _validate_common(cfg: SimpleNamespace) -> None:
    if cfg.env is None and cfg.data.prompt_dataset is None:
        raise ConfigError("no data: pass --env ns/name-vN (its train split) or --data.prompt_dataset FILE.jsonl")
    if cfg.ckpt.output_dir is None:
        raise ConfigError("--ckpt.output_dir is required (metrics, checkpoints and the final hf/ model go there)")
    if cfg.actor.num_workers < 1:
        raise ConfigError(f"--actor.num_workers must be >= 1, got {cfg.actor.num_workers}")
    gpus = getattr(cfg.actor, "num_gpus_per_node", 0)
    if gpus < 0 or (gpus and cfg.actor.num_workers not in (1, gpus)):
        raise ConfigError(
            f"--actor.num_gpus_per_node {gpus} gives one trainer rank per GPU, which contradicts "
            f"--actor.num_workers {cfg.actor.num_workers}; pass only one of them"
        )
    if gpus:
        cfg.actor.num_workers = gpus
    _choice("--actor.lr_scheduler", cfg.actor.lr_scheduler, ("constant", "cosine"))
    _choice("--actor.backend", cfg.actor.backend, BACKENDS)
    _choice("--actor.param_dtype", cfg.actor.param_dtype, ("bfloat16", "float32"))
    for name in ("micro_batch_size", "max_tokens_per_gpu"):
        if getattr(cfg.train, name) < 1:
            raise ConfigError(f"--train.{name} must be >= 1, got {getattr(cfg.train, name)}")


def validate_rl(cfg: SimpleNamespace) -> None:
    _validate_common(cfg)
    if cfg.env is None and cfg.train.agent_path is None:
        raise ConfigError("no agent: pass --env ns/name-vN or --train.agent_path agent.py")
    if cfg.actor.model_name_or_path is None:
        raise ConfigError("--actor.model_name_or_path is required (e.g. runs/sft/hf from `molt-train sft`)")
    _validate_engine(cfg)
    adv, algo = cfg.algo.advantage, cfg.algo
    _choice("--algo.advantage.estimator", adv.estimator, sorted(ESTIMATORS))
    _choice("--actor.loss_mode", cfg.actor.loss_mode, sorted(POLICY_LOSSES))
    _choice("--actor.loss_agg_mode", cfg.actor.loss_agg_mode, LOSS_AGG_MODES)
    _choice("--algo.kl.estimator", algo.kl.estimator, KL_ESTIMATORS)
    _choice("--algo.kl.ref", algo.kl.ref, ("rollout", "model"))
    n = cfg.rollout.n_samples_per_prompt
    if adv.estimator in GROUP_ESTIMATORS and n < 2:
        raise ConfigError(
            f"--algo.advantage.estimator {adv.estimator} compares samples of one prompt and needs "
            f"--rollout.n_samples_per_prompt > 1, got {n}"
        )
    if algo.dynamic_filtering_enable and n < 2:
        raise ConfigError(f"--algo.dynamic_filtering_enable needs --rollout.n_samples_per_prompt > 1, got {n}")
    low, high = cfg.actor.eps_clip_low_high
    if low < 0 or high < 0:
        raise ConfigError(f"--actor.eps_clip_low_high must be >= 0, got {low} {high}")
    if cfg.actor.dual_clip is not None and cfg.actor.dual_clip <= 1:
        raise ConfigError(f"--actor.dual_clip must be > 1 (recipes use 10), got {cfg.actor.dual_clip}")
    if cfg.train.async_queue_size < 1:
        raise ConfigError(f"--train.async_queue_size must be >= 1, got {cfg.train.async_queue_size}")
    if cfg.train.force_sync_mode and cfg.train.async_queue_size > 1:
        raise ConfigError(
            f"--train.force_sync_mode is strictly on-policy and contradicts --train.async_queue_size "
            f"{cfg.train.async_queue_size}; drop one of them"
        )
    if cfg.rollout.max_new_tokens >= cfg.data.max_len:
        raise ConfigError(
            f"--rollout.max_new_tokens {cfg.rollout.max_new_tokens} leaves no room for the prompt "
            f"under --data.max_len {cfg.data.max_len}"
        )
    if algo.kl.init_coef < 0:
        raise ConfigError(f"--algo.kl.init_coef must be >= 0, got {algo.kl.init_coef}")
    queue = 0 if cfg.train.force_sync_mode else cfg.train.async_queue_size
    try:
        validate_is_config(
            adv.is_correction_level,
            adv.is_correction_mode,
            queue,
            cfg.train.partial_rollout_enable,
            cfg.rollout.top_p,
            adv.is_correction_threshold,
        )
        reward_shaping(cfg)
    except ValueError as exc:
        raise ConfigError(_flagged(str(exc))) from None
    if algo.kl.init_coef > 0 and algo.kl.ref == "rollout" and cfg.rollout.top_p < 1:
        raise ConfigError(
            f"--algo.kl.ref rollout reads the sampler's log-probs, which --rollout.top_p "
            f"{cfg.rollout.top_p} renormalises away; use --rollout.top_p 1.0 or --algo.kl.ref model"
        )
    if cfg.train.batch_size < 0 or cfg.train.max_epochs < 1:
        raise ConfigError("--train.batch_size must be >= 0 and --train.max_epochs >= 1")


def _validate_engine(cfg: SimpleNamespace) -> None:
    """``--rollout.engine`` and what goes with it: vllm runs colocated on one GPU (CUDA IPC weight sync); a
    partial rollout (a sync with requests in flight) is the vllm engine's pause/resume."""
    engine, train = cfg.rollout.engine, cfg.train
    _choice("--rollout.engine", engine, ("hf", "vllm"))
    if train.partial_rollout_enable and engine != "vllm":
        raise ConfigError(
            "--train.partial_rollout_enable pauses and resumes requests inside the vllm engine; "
            "add --rollout.engine vllm"
        )
    if train.partial_rollout_enable and train.force_sync_mode:
        raise ConfigError(
            "--train.partial_rollout_enable syncs weights under rollouts in flight, which "
            "--train.force_sync_mode forbids; drop one of them"
        )
    if engine != "vllm":
        return
    try:
        options = vllm_options(cfg)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    parallel = (options.tensor_parallel_size, options.data_parallel_size)
    if parallel != (1, 1):
        raise ConfigError(
            f"--rollout.engine vllm drives single-GPU engines here: it needs "
            f"--vllm.tensor_parallel_size 1 --vllm.data_parallel_size 1, got {parallel[0]}, {parallel[1]}"
        )
    if options.num_engines != 1 and not train.colocate_all:
        raise ConfigError(
            f"--vllm.num_engines {options.num_engines} puts that many engines on the one GPU the "
            "trainer shares with them; add --train.colocate_all, or use --vllm.num_engines 1 for an "
            "engine on a GPU of its own"
        )
    if options.enable_sleep and not train.colocate_all:
        raise ConfigError(
            "--vllm.enable_sleep frees the GPU the engine shares with the trainer; with the engine "
            "on a GPU of its own (no --train.colocate_all) drop it"
        )
    if options.enable_sleep and not train.force_sync_mode:
        raise ConfigError(
            "--vllm.enable_sleep frees the engine while the trainer trains, so rollout and training "
            "must take turns: add --train.force_sync_mode"
        )
    if options.max_model_len < cfg.data.max_len:
        raise ConfigError(
            f"--vllm.max_model_len {options.max_model_len} is shorter than --data.max_len "
            f"{cfg.data.max_len}; raise it or drop it (default: --data.max_len)"
        )


def vllm_options(cfg: SimpleNamespace) -> VLLMOptions:
    """The engine's options from ``--vllm.*``, seeded by ``--train.seed``, sized to ``--data.max_len``."""
    options = VLLMOptions.from_namespace(cfg.vllm)
    return replace(options, seed=cfg.train.seed, max_model_len=options.max_model_len or cfg.data.max_len)


def require_installed(cfg: SimpleNamespace) -> None:
    """Optional packages the chosen engine / backend import, checked before anything starts."""
    if getattr(cfg.rollout, "engine", "hf") == "vllm" and not _importable("vllm"):
        raise ConfigError(f"{VLLM_INSTALL_HINT} (vllm is not importable in this environment)")
    if cfg.actor.backend == "automodel" and not _importable("nemo_automodel"):
        raise ConfigError(f"{AUTOMODEL_INSTALL_HINT} (nemo_automodel is not importable in this environment)")


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a broken or half-initialised install
        return False


def validate_sft(cfg: SimpleNamespace) -> None:
    _validate_common(cfg)
    if (cfg.model.config is None) == (cfg.actor.model_name_or_path is None):
        raise ConfigError(
            "pass exactly one of --model.config tiny (train from scratch) and "
            "--actor.model_name_or_path DIR (fine-tune a checkpoint)"
        )
    if cfg.model.config not in (None, "tiny"):
        raise ConfigError(f"--model.config {cfg.model.config!r} is unknown; the built-in config is 'tiny'")


def validate_eval(cfg: SimpleNamespace) -> None:
    if cfg.actor.model_name_or_path is None:
        raise ConfigError("--actor.model_name_or_path is required")
    if cfg.env is None and cfg.train.agent_path is None:
        raise ConfigError("pass --env ns/name-vN (its --eval.split gives the rows)")


def reward_shaping(cfg: SimpleNamespace) -> RewardShaping:
    r = cfg.reward
    return RewardShaping(
        clip_range=tuple(r.clip_range),
        overlong_buffer_len=r.overlong_buffer_len,
        overlong_penalty_factor=r.overlong_penalty_factor,
        stop_properly_penalty_coef=r.stop_properly_penalty_coef,
        max_len=cfg.data.max_len,
    )


def _choice(flag: str, value: str, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise ConfigError(f"{flag} {value!r} is unknown; choose one of {list(allowed)}")


_FLAG_NAMES = {
    "is_correction_level": "--algo.advantage.is_correction_level",
    "is_correction_mode": "--algo.advantage.is_correction_mode",
    "is_correction_threshold": "--algo.advantage.is_correction_threshold",
    "async_queue_size": "--train.async_queue_size",
    "partial_rollout": "--train.partial_rollout_enable",
    "top_p": "--rollout.top_p",
    "overlong_buffer_len": "--reward.overlong_buffer_len",
    "stop_properly_penalty_coef": "--reward.stop_properly_penalty_coef",
    "overlong_penalty_factor": "--reward.overlong_penalty_factor",
    "clip_range": "--reward.clip_range",
}


def _flagged(message: str) -> str:
    """Rename the algorithms' keyword names in an error to the CLI flags the user typed."""
    for name, flag in _FLAG_NAMES.items():
        message = re.sub(rf"(?<![\w.-]){name}\b", flag, message)
    return message
