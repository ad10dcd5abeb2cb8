"""The trainer's configuration: one frozen dataclass per flag group, one per command, validated in one place.

Every flag is declared once, as a field of its group (type, default, help: ``flags.option``), and keeps that name
from the command line to the worker that reads it: ``--actor.eps_clip_low_high`` is ``cfg.actor.eps_clip_low_high``
in the controller, in the Ray actors (which receive the group objects themselves) and in the loss. The command
configs (``RLConfig``, ``SFTConfig``, ``EvalCommandConfig``) hold the groups their command reads; building one fills
the dependent defaults and refuses combinations that would silently train the wrong thing, with a ``ConfigError``
naming the flags. ``parse(command, argv)`` is the command line's way in (a refused value exits with status 2).

The algorithm's groups and rules live in ``algo_config.py`` (``validate_algo``), the vllm engine's in
``engine_config.py`` (``validate_engine``); both are re-exported here. To add a flag: a field in its group. To add a
group: a frozen dataclass, a ``group(...)`` field in the command configs that read it, its cross-flag rules called
from that command's ``_validate``.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from molt_train import flags
from molt_train.actor_backend import AUTOMODEL_INSTALL_HINT, BACKENDS
from molt_train.algo_config import (
    AdamConfig,
    AdvantageConfig,
    AlgoConfig,
    CriticConfig,
    KLConfig,
    RewardConfig,
    algo_defaults,
    validate_algo,
)
from molt_train.algorithms import LOSS_AGG_MODES, POLICY_LOSSES
from molt_train.data import check_env_mix
from molt_train.engine_config import VLLMConfig, validate_engine
from molt_train.engines.vllm import VLLM_INSTALL_HINT
from molt_train.flags import ConfigError, group, option
from molt_train.parallel import FSDPConfig, check_fsdp

__all__ = [
    "COMMANDS",
    "AdamConfig",
    "AdvantageConfig",
    "AlgoConfig",
    "ConfigError",
    "CriticConfig",
    "EvalCommandConfig",
    "KLConfig",
    "ModelConfig",
    "RLConfig",
    "RewardConfig",
    "SFTConfig",
    "VLLMConfig",
    "parse",
]

RL = ("rl",)  # the commands that read a field (default: every command with its group)
LORA_FIELDS = ("lora_dim", "lora_alpha", "lora_target_modules")


# -- the flag groups --


@dataclass(frozen=True)
class RayConfig:
    """The Ray cluster the run's actors are placed on."""

    address: str | None = option(None, "join this Ray cluster; default: start a local instance")
    num_cpus: int | None = option(None, "CPUs of the local Ray instance (default: all)", minimum=1)


@dataclass(frozen=True)
class ModelConfig:
    """A model built from scratch (the tokenizer is trained on the env's train split)."""

    config: str | None = option(
        None,
        "build a model from scratch: 'tiny' (a Qwen2 decoder) or 'tiny-vl' (a LLaVA VLM with its processor)",
        choices=("tiny", "tiny-vl"),
    )
    hidden_size: int = option(64, "tiny model width", minimum=1)
    num_layers: int = option(2, "tiny model depth", minimum=1)
    num_heads: int = option(4, "tiny model attention heads", minimum=1)
    intermediate_size: int = option(0, "tiny model MLP width (0 = 4 x hidden_size)", minimum=0)
    vocab_size: int = option(512, "tiny tokenizer vocabulary (byte-level BPE, one token per digit)", minimum=1)
    image_size: int = option(
        48, "tiny-vl image side in pixels (images are resized and centre-cropped to it)", minimum=1
    )
    patch_size: int = option(
        8, "tiny-vl vision patch side in pixels: (image_size / patch_size) ** 2 image tokens", minimum=1
    )
    role_tokens: bool = option(
        False,
        "train the tiny tokenizer on the chat template's role names too, so a role header is a few tokens, not one "
        "a character (molt/tictactoe-v3's copy needs it)",
    )
    lora_dim: int = option(0, "LoRA rank: train PEFT adapters only (0 = full fine-tuning)", minimum=0)
    lora_alpha: float = option(16.0, "LoRA scale numerator (the adapter is scaled by alpha / rank)", minimum=0)
    lora_target_modules: tuple[str, ...] = option(
        (), "LoRA targets: globs over full module names, e.g. '*.q_proj' '*.v_proj' (default: every linear layer)"
    )


@dataclass(frozen=True)
class ActorConfig:
    """The policy: its checkpoint, FSDP2 ranks, optimizer, schedule and policy loss."""

    model_name_or_path: str | None = option(None, "HF checkpoint directory of the policy")
    num_workers: int = option(1, "FSDP2 trainer processes (gloo on CPU, NCCL on GPU)", minimum=1)
    num_gpus_per_node: int = option(
        0, "GPUs for the trainer (one FSDP2 rank each; sets --actor.num_workers); 0 = --actor.num_workers", commands=RL
    )
    backend: str = option(
        "hf",
        "policy model library: hf (transformers) | automodel (NeMo AutoModel; needs CUDA and nemo_automodel)",
        choices=BACKENDS,
    )
    freeze_moe_router: bool = option(False, "keep MoE router weights at their checkpoint values (MoE models only)")
    adam: AdamConfig = group(AdamConfig)
    lr_warmup_ratio: float = option(0.0, "linear LR warm-up over this fraction of the optimizer steps", minimum=0)
    lr_scheduler: str = option(
        "constant",
        "after warm-up: constant | cosine (decay to --actor.min_lr_ratio)",
        choices=("constant", "cosine"),
    )
    min_lr_ratio: float = option(0.0, "cosine schedule floor, as a fraction of the learning rate", minimum=0)
    max_norm: float = option(1.0, "gradient clipping norm (0 = off)", minimum=0)
    logprob_chunk_size: int = option(
        1024, "positions per log-prob chunk (bounds the fp32 vocab logits alive)", minimum=1
    )
    gradient_checkpoint: bool = option(False, "recompute decoder layers in backward")
    param_dtype: str = option(
        "bfloat16",
        "GPU compute dtype: FSDP2 mixed precision over fp32 master weights; CPU always computes in float32",
        choices=("bfloat16", "float32"),
    )
    compile: bool = option(
        False,
        "torch.compile each decoder layer and the log-prob chunk (GPU: 48 percent training MFU at 0.6B on an "
        "H200, 2.3x eager; the first step pays ~1 min compiling)",
    )
    num_threads: int = option(
        0,
        "torch CPU threads per trainer process (0 = the host's cores / concurrent processes)",
        minimum=0,
    )
    loss_mode: str = option("ppo", "policy loss", choices=POLICY_LOSSES, commands=RL)
    eps_clip_low_high: tuple[float, float] = option((0.2, 0.2), "PPO clip range below/above 1", commands=RL)
    dual_clip: float | None = option(
        None, "dual-clip bound c > 1 for negative advantages (off by default)", commands=RL
    )
    loss_agg_mode: str = option("token-mean", "how per-token losses become one", choices=LOSS_AGG_MODES, commands=RL)


@dataclass(frozen=True)
class RefConfig:
    """The frozen reference model of ``--algo.kl.ref model``."""

    model_name_or_path: str | None = option(None, "frozen reference model (default: the actor checkpoint)")


@dataclass(frozen=True)
class DataConfig:
    """Training rows: the env's split or a JSONL file, and the context length."""

    prompt_dataset: str | None = option(None, "JSONL file of prompts, overriding the env's train split")
    input_key: str = option("input", "prompt field of --data.prompt_dataset rows")
    label_key: str = option("label", "label field of --data.prompt_dataset rows")
    output_key: str = option("output", "reference completion field of --data.prompt_dataset rows", commands=("sft",))
    image_key: str | None = option(
        None,
        "image field of --data.prompt_dataset rows, for a vision model (base64, data: URIs or paths; one or a list)",
    )
    split: str = option("train", "env split to train on")
    max_samples: int | None = option(None, "train on at most this many rows", minimum=1)
    max_len: int = option(1024, "total context (prompt + generated) in tokens", minimum=2)


@dataclass(frozen=True)
class RolloutConfig:
    """Generation: the engine, the batch of prompts and samples, sampling and episode limits."""

    engine: str = option(
        "hf",
        "rollout engine: hf (transformers; CPU or GPU) | vllm (CUDA; colocated with --train.colocate_all, else on "
        "GPUs of its own)",
        choices=("hf", "vllm"),
        commands=RL,
    )
    batch_size: int = option(16, "prompts per rollout batch", minimum=1, commands=RL)
    n_samples_per_prompt: int = option(1, "samples per prompt (a group)", minimum=1, commands=RL)
    max_new_tokens: int = option(256, "generated tokens per turn at most", minimum=1)
    temperature: float = option(1.0, "sampling temperature", minimum=0, commands=RL)
    top_p: float = option(1.0, "nucleus sampling", commands=RL)
    top_k: int = option(-1, "top-k sampling (-1 = off)", commands=RL)
    timeout_s: float = option(600.0, "an episode running longer is dropped as 'timeout'", minimum=0)
    max_batch_size: int = option(256, "sequences the hf engine decodes together", minimum=1)
    num_workers: int = option(
        1,
        "rollout actors (hf engine + runner each) spread over the nodes; they split each batch",
        minimum=1,
        commands=RL,
    )


@dataclass(frozen=True)
class TrainConfig:
    """The training loop: steps, batches, the async queue, placement and weight sync."""

    agent_path: str | None = option(None, "agent .py exporting AgentRunner (overrides the env's runner)")
    seed: int = option(42, "seed for data order, sampling and init")
    num_steps: int = option(20, "training steps (rl: one rollout batch each)")
    batch_size: int = option(0, "rows per optimizer step (rl: 0 = the whole rollout batch)", minimum=0)
    micro_batch_size: int = option(64, "rows per micro-batch at most", minimum=1)
    max_tokens_per_gpu: int = option(8192, "padded tokens per micro-batch at most (token budget)", minimum=1)
    max_epochs: int = option(1, "passes over each rollout batch", minimum=1, commands=RL)
    async_queue_size: int = option(
        1,
        "rollout batches in flight ahead of training when rollout overlaps it (> 1 overlaps, and needs IS correction)",
        minimum=1,
        commands=RL,
    )
    force_sync_mode: bool | None = option(
        None,
        "strictly on-policy: the next rollout starts only after the weight sync (the default, unless "
        "--train.async_queue_size > 1 or --train.partial_rollout_enable asks for overlap); --no-train.force_sync_mode "
        "overlaps rollout k+1 with step k (one step stale, uncorrected unless --algo.advantage.is_correction_level)",
        commands=RL,
    )
    partial_rollout_enable: bool = option(
        False,
        "sync weights while rollouts are in flight: the vllm engine pauses them, loads, and resumes on the new "
        "weights (needs IS correction)",
        commands=RL,
    )
    colocate_all: bool = option(
        False,
        "trainer ranks, reference and rollout engine share the GPU (fractional Ray GPUs); the vllm engine then "
        "syncs by CUDA IPC. Without it, --rollout.engine vllm gets GPUs of its own and syncs by NCCL broadcast",
        commands=RL,
    )
    check_weight_update_equal: bool = option(
        False,
        "after every weight sync compare each engine parameter with the trainer's; a stale or unreached one "
        "stops the run, named",
        commands=RL,
    )
    rollout_dump_dir: str | None = option(
        None,
        "write every rollout batch the trainer takes to DIR/batch_<step>.pkl (for --train.rollout_replay_dir)",
        commands=RL,
    )
    rollout_replay_dir: str | None = option(
        None,
        "train on the batches a --train.rollout_dump_dir run wrote, in order, with no rollout engine (no "
        "generation, no weight sync, no eval)",
        commands=RL,
    )
    routing_replay: bool = option(
        False,
        "MoE models (R3): the rollout engine records every position's experts and the training forward routes each "
        "token through them (gate weights from the trainer's own router, which still trains); reports "
        "train/routing_mismatch_frac",
        commands=RL,
    )
    record_routing: bool = option(
        False,
        "MoE models: record the rollout engine's experts and report train/routing_mismatch_frac (the fraction of "
        "(token, layer) choices the trainer makes otherwise) without replaying them",
        commands=RL,
    )
    colocate_fsdp_models: bool = option(
        True,
        "the reference ranks share the policy ranks' GPUs (bundles); --no-train.colocate_fsdp_models gives them "
        "GPUs of their own",
        commands=RL,
    )

    @property
    def on_policy(self) -> bool:
        """Whether rollout waits for the weight sync (``--train.force_sync_mode``, or its default: on unless a
        queue deeper than one batch or a partial rollout asks for overlap)."""
        if self.force_sync_mode is not None:
            return self.force_sync_mode
        return self.async_queue_size == 1 and not self.partial_rollout_enable

    @property
    def routing(self) -> str | None:
        """MoE routing across rollout and training (``molt_train.routing``): "replay", "record" (measure only) or
        None."""
        return "replay" if self.routing_replay else "record" if self.record_routing else None


@dataclass(frozen=True)
class CkptConfig:
    """The run directory: metrics, resumable checkpoints and the final model."""

    output_dir: str | None = option(None, "run directory: metrics, checkpoints, hf/ (the final model)")
    save_steps: int = option(0, "save a resumable checkpoint every N steps (0 = only at the end)", minimum=0)
    max_num: int = option(2, "resumable checkpoints kept", minimum=1)
    load_enable: bool = option(False, "resume from the latest checkpoint in --ckpt.output_dir")
    save_hf: bool = option(
        False,
        "also export every --ckpt.save_steps checkpoint's model to hf_steps/step_N (safetensors + tokenizer), "
        "kept whatever --ckpt.max_num rotates away",
        commands=RL,
    )


@dataclass(frozen=True)
class EvalConfig:
    """Held-out evaluation on the env's split."""

    split: str = option("test", "held-out split for evaluation")
    steps: int = option(0, "evaluate every N steps (0 = only at the end)", minimum=0, commands=RL)
    max_samples: int | None = option(
        None, "evaluate on at most this many rows, of each env in a mix (sft: 0 skips the final eval)", minimum=0
    )
    max_new_tokens: int | None = option(None, "generation budget at eval (default: the rollout's)", minimum=1)
    temperature: float = option(0.0, "eval sampling temperature (0 = greedy)", minimum=0)
    n_samples_per_prompt: int = option(1, "samples per row at eval; pass@k is logged for every k <= n", minimum=1)
    eval_at_start: bool = option(False, "evaluate before the first step", commands=RL)
    eval_only: bool = option(
        False,
        "score --actor.model_name_or_path once on --eval.split (or --eval.dataset) and exit; no trainer "
        "workers are built",
        commands=RL,
    )
    dataset: str | None = option(
        None, "JSONL file of eval rows (--data.input_key / --data.label_key fields) instead of --eval.split"
    )
    top_p: float | None = option(None, "eval nucleus sampling (default: --rollout.top_p)")


@dataclass(frozen=True)
class LoggerConfig:
    """What a run prints and writes besides metrics.jsonl and TensorBoard (and where else it logs)."""

    progress: bool = option(True, "rich progress bar on the console")
    wandb_project: str | None = option(
        None,
        "also log every step's metrics to this Weights & Biases project; the run lives in <output_dir>/wandb "
        "(WANDB_MODE=offline keeps it there: `wandb sync <output_dir>/wandb/offline-run-*` uploads it later)",
    )
    wandb_run_name: str | None = option(None, "the W&B run's name (default: W&B's)")


@dataclass(frozen=True)
class JudgeConfig:
    """LLM-as-judge rewards: the endpoint every episode's judge client (StepState["judge"], ChatContext.judge) calls."""

    policy: bool = option(
        False, "serve judge calls with the rollout engine itself: the current policy judges (weight syncs reach it)"
    )
    model_name_or_path: str | None = option(
        None, "a frozen judge model (HF checkpoint), served by an hf engine of its own in the rollout actor"
    )
    timeout_s: float = option(60.0, "a judge call running longer ends its episode as failure_judge", minimum=0)
    max_new_tokens: int = option(16, "tokens a judge reply may take at most", minimum=1)

    @property
    def enabled(self) -> bool:
        return self.policy or self.model_name_or_path is not None


ENV_HELP = (
    "registered env ID (ns/name-vN); its train split gives prompts and labels. Repeat as ID:WEIGHT for a mix "
    "(weights normalised; each batch drawn by weight)"
)


# -- the commands --


@dataclass(frozen=True)
class RLConfig:
    """``molt-train rl``: online RL on a registered env."""

    env: tuple[str, ...] = option((), ENV_HELP, repeat=True)
    ray: RayConfig = group(RayConfig)
    actor: ActorConfig = group(ActorConfig)
    fsdp: FSDPConfig = group(FSDPConfig)
    ref: RefConfig = group(RefConfig)
    model: ModelConfig = group(ModelConfig, only=LORA_FIELDS)
    data: DataConfig = group(DataConfig)
    rollout: RolloutConfig = group(RolloutConfig)
    algo: AlgoConfig = group(AlgoConfig)
    critic: CriticConfig = group(CriticConfig)
    reward: RewardConfig = group(RewardConfig)
    vllm: VLLMConfig = group(VLLMConfig)
    train: TrainConfig = group(TrainConfig)
    ckpt: CkptConfig = group(CkptConfig)
    eval: EvalConfig = group(EvalConfig)
    logger: LoggerConfig = group(LoggerConfig)
    judge: JudgeConfig = group(JudgeConfig)

    def __post_init__(self) -> None:
        check_env_mix(self)
        flags.check_declared(self, "rl")
        _set(self, "actor", replace(self.actor, num_workers=_trainer_ranks(self.actor)))
        _set(self, "vllm", replace(self.vllm, max_model_len=self.vllm.max_model_len or self.data.max_len))
        _set(self, "algo", algo_defaults(self.algo))
        self._validate()

    @property
    def sampling_temperature(self) -> float:
        """The temperature log-probs are computed at: the rollout's (greedy rollouts: 1)."""
        return self.rollout.temperature or 1.0

    @property
    def kl_as_reward(self) -> bool:
        return self.algo.kl.init_coef > 0 and not self.algo.kl.use_loss

    def _validate(self) -> None:
        if not self.eval.eval_only:
            _require_data(self)
        _require_output_dir(self)
        if not self.env and self.train.agent_path is None and self.algo.advantage.estimator != "on_policy_distill":
            raise ConfigError("no agent: pass --env ns/name-vN or --train.agent_path agent.py")
        if self.actor.model_name_or_path is None:
            raise ConfigError("--actor.model_name_or_path is required (e.g. runs/sft/hf from `molt-train sft`)")
        check_fsdp(self.fsdp, self.actor.num_workers, self.actor.backend, self.model.lora_dim)
        train = self.train
        if train.force_sync_mode and train.async_queue_size > 1:
            raise ConfigError(
                f"--train.force_sync_mode is strictly on-policy and contradicts --train.async_queue_size "
                f"{train.async_queue_size}; drop one of them"
            )
        if self.rollout.max_new_tokens >= self.data.max_len:
            raise ConfigError(
                f"--rollout.max_new_tokens {self.rollout.max_new_tokens} leaves no room for the prompt "
                f"under --data.max_len {self.data.max_len}"
            )
        if not 0 < self.rollout.top_p <= 1:
            raise ConfigError(f"--rollout.top_p must be in (0, 1], got {self.rollout.top_p}")
        validate_engine(self)
        validate_algo(self)
        _validate_lora(self)
        _require_installed(self.actor.backend, self.rollout.engine)
        self._validate_run_modes()

    def _validate_run_modes(self) -> None:
        """``--eval.eval_only`` and ``--train.rollout_dump_dir`` / ``rollout_replay_dir``: runs that skip a part."""
        ev, train = self.eval, self.train
        if ev.top_p is not None and not 0 < ev.top_p <= 1:
            raise ConfigError(f"--eval.top_p must be in (0, 1], got {ev.top_p}")
        if ev.eval_only:
            if not self.env and ev.dataset is None:
                raise ConfigError(
                    "--eval.eval_only needs rows: pass --env ns/name-vN (its --eval.split) or --eval.dataset FILE"
                )
            if ev.max_samples == 0:
                raise ConfigError("--eval.eval_only with --eval.max_samples 0 has nothing to score; drop one of them")
            for flag, value in (
                ("--ckpt.load_enable", self.ckpt.load_enable),
                ("--train.rollout_replay_dir", train.rollout_replay_dir),
                ("--train.rollout_dump_dir", train.rollout_dump_dir),
            ):
                if value:
                    raise ConfigError(
                        f"--eval.eval_only scores --actor.model_name_or_path and trains nothing, so {flag} does "
                        "nothing; drop it (to score a checkpoint, pass its hf/ directory as --actor.model_name_or_path)"
                    )
        if train.colocate_all and not train.colocate_fsdp_models:
            raise ConfigError(
                "--train.colocate_all puts the reference ranks on the policy's GPUs, which "
                "--no-train.colocate_fsdp_models forbids; drop one of them"
            )
        if self.judge.policy and self.judge.model_name_or_path:
            raise ConfigError(
                "--judge.policy (the policy judges) and --judge.model_name_or_path (a frozen judge) are two judges; "
                "keep one"
            )
        if train.routing is not None and (self.actor.backend != "hf" or self.actor.compile):
            raise ConfigError(
                "--train.routing_replay / --train.record_routing wrap the routers of transformers' MoE models in "
                "eager mode: they need --actor.backend hf without --actor.compile"
            )
        if train.rollout_replay_dir is None:
            return
        if self.judge.enabled:
            raise ConfigError(
                "--train.rollout_replay_dir builds no rollout engine and runs no env, so no judge is called; "
                "drop --judge.*"
            )
        if train.rollout_dump_dir is not None:
            raise ConfigError(
                "--train.rollout_replay_dir trains on dumped batches and generates none, so there is nothing for "
                "--train.rollout_dump_dir to write; drop one of them"
            )
        if not Path(train.rollout_replay_dir).is_dir():
            raise ConfigError(
                f"--train.rollout_replay_dir {train.rollout_replay_dir!r} is not a directory; pass the "
                "--train.rollout_dump_dir of an earlier run"
            )
        for flag, value in (
            ("--eval.steps", ev.steps),
            ("--eval.eval_at_start", ev.eval_at_start),
            ("--train.partial_rollout_enable", train.partial_rollout_enable),
            ("--train.check_weight_update_equal", train.check_weight_update_equal),
        ):
            if value:
                raise ConfigError(f"--train.rollout_replay_dir builds no rollout engine, so {flag} cannot act; drop it")


@dataclass(frozen=True)
class SFTConfig:
    """``molt-train sft``: supervised fine-tuning on an env's reference completions."""

    env: tuple[str, ...] = option((), ENV_HELP, repeat=True)
    ray: RayConfig = group(RayConfig)
    model: ModelConfig = group(ModelConfig)
    actor: ActorConfig = group(ActorConfig)
    fsdp: FSDPConfig = group(FSDPConfig)
    data: DataConfig = group(DataConfig)
    train: TrainConfig = group(TrainConfig, num_steps=200, batch_size=64)
    rollout: RolloutConfig = group(RolloutConfig)  # generation limits of the final eval
    ckpt: CkptConfig = group(CkptConfig)
    eval: EvalConfig = group(EvalConfig)
    logger: LoggerConfig = group(LoggerConfig)

    def __post_init__(self) -> None:
        check_env_mix(self)
        flags.check_declared(self, "sft")
        _require_data(self)
        _require_output_dir(self)
        if (self.model.config is None) == (self.actor.model_name_or_path is None):
            raise ConfigError(
                "pass exactly one of --model.config tiny|tiny-vl (train from scratch) and "
                "--actor.model_name_or_path DIR (fine-tune a checkpoint)"
            )
        if self.train.batch_size < 1:
            raise ConfigError(f"--train.batch_size must be >= 1, got {self.train.batch_size}")
        check_fsdp(self.fsdp, self.actor.num_workers, self.actor.backend, self.model.lora_dim)
        if self.model.lora_dim and self.model.config is not None:
            raise ConfigError(
                "--model.lora_dim trains adapters over a pretrained model; --model.config tiny builds an untrained "
                "one: drop --model.lora_dim, or pass --actor.model_name_or_path DIR instead of --model.config"
            )
        _validate_lora(self)
        _require_installed(self.actor.backend, "hf")


@dataclass(frozen=True)
class EvalCommandConfig:
    """``molt-train eval``: a checkpoint's accuracy on an env's held-out split (or on each env's of a mix)."""

    env: tuple[str, ...] = option(
        (),
        "registered env ID (ns/name-vN); its --eval.split gives the rows. Repeat (ID or ID:WEIGHT, as for rl and "
        "sft) to score each env's split: figures per env (<ID>/accuracy, ...) next to the overall ones, which are "
        "over all rows (a weight changes nothing here)",
        repeat=True,
    )
    actor: ActorConfig = group(ActorConfig, only=("model_name_or_path",))
    data: DataConfig = group(DataConfig, only=("max_len",))
    rollout: RolloutConfig = group(RolloutConfig, only=("max_new_tokens", "timeout_s", "max_batch_size"))
    train: TrainConfig = group(TrainConfig, only=("agent_path",))
    eval: EvalConfig = group(EvalConfig)

    def __post_init__(self) -> None:
        check_env_mix(self)
        flags.check_declared(self, "eval")
        if self.actor.model_name_or_path is None:
            raise ConfigError("--actor.model_name_or_path is required (the checkpoint to score)")
        if not self.env:
            raise ConfigError("pass --env ns/name-vN (its --eval.split gives the rows)")
        if len(self.env) > 1 and self.eval.dataset:
            raise ConfigError(
                f"--eval.dataset {self.eval.dataset!r} holds one env's rows; give one --env with it, not a mix"
            )


COMMANDS: dict[str, type] = {"rl": RLConfig, "sft": SFTConfig, "eval": EvalCommandConfig}


def parse(command: str, argv: Sequence[str] | None) -> Any:
    """``command``'s config from ``argv``; a refused value exits with status 2 and a message naming the flag."""
    cls = COMMANDS[command]
    return flags.parse(cls, command, argv, description=cls.__doc__.splitlines()[0].replace("``", ""))


# -- rules several commands share --


def _set(cfg: Any, name: str, value: Any) -> None:
    """Fill a dependent default while the frozen config is being built."""
    object.__setattr__(cfg, name, value)


def _trainer_ranks(actor: ActorConfig) -> int:
    gpus = actor.num_gpus_per_node
    if gpus < 0 or (gpus and actor.num_workers not in (1, gpus)):
        raise ConfigError(
            f"--actor.num_gpus_per_node {gpus} gives one trainer rank per GPU, which contradicts "
            f"--actor.num_workers {actor.num_workers}; pass only one of them"
        )
    return gpus or actor.num_workers


def _require_data(cfg: RLConfig | SFTConfig) -> None:
    if not cfg.env and cfg.data.prompt_dataset is None:
        raise ConfigError("no data: pass --env ns/name-vN (its train split) or --data.prompt_dataset FILE.jsonl")


def _require_output_dir(cfg: RLConfig | SFTConfig) -> None:
    if cfg.ckpt.output_dir is None:
        raise ConfigError("--ckpt.output_dir is required (metrics, checkpoints and the final hf/ model go there)")


def _validate_lora(cfg: RLConfig | SFTConfig) -> None:
    model = cfg.model
    if not model.lora_dim:
        if model.lora_target_modules:
            raise ConfigError("--model.lora_target_modules needs --model.lora_dim > 0 (the LoRA rank)")
        return
    if cfg.actor.backend != "hf":
        raise ConfigError(
            f"--model.lora_dim injects PEFT adapters into a transformers model; --actor.backend "
            f"{cfg.actor.backend} is not supported with LoRA: use --actor.backend hf"
        )
    if model.lora_alpha <= 0:
        raise ConfigError(f"--model.lora_alpha must be > 0 with --model.lora_dim, got {model.lora_alpha}")
    if cfg.rollout.engine == "vllm" and cfg.train.check_weight_update_equal:
        raise ConfigError(
            "--train.check_weight_update_equal compares the engine's parameters with the trainer's, but with "
            "--model.lora_dim the vllm engine keeps the base weights and serves the adapter directory the trainer "
            "writes: drop --train.check_weight_update_equal (the hf engine's LoRA sync is checked)"
        )
    if cfg.actor.adam.lr < 1e-4:
        logging.getLogger(__name__).warning(
            "--model.lora_dim %d with --actor.adam.lr %g: adapters need a LoRA-scale learning rate (1e-4 and up)",
            model.lora_dim,
            cfg.actor.adam.lr,
        )


def _require_installed(backend: str, engine: str) -> None:
    """Optional packages the chosen engine / backend import, checked before anything starts."""
    if engine == "vllm" and not _importable("vllm"):
        raise ConfigError(f"{VLLM_INSTALL_HINT} (vllm is not importable in this environment)")
    if backend == "automodel" and not _importable("nemo_automodel"):
        raise ConfigError(f"{AUTOMODEL_INSTALL_HINT} (nemo_automodel is not importable in this environment)")


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a broken or half-initialised install
        return False


if __name__ == "__main__":  # the flag tables of molt_train/README.md
    print(flags.markdown(COMMANDS))
