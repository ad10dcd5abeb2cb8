"""The trainer's configuration: one frozen dataclass per flag group, one per command, validated in one place.

Every flag is declared once, as a field of its group (type, default, help: ``flags.option``), and keeps that name
from the command line to the worker that reads it: ``--actor.eps_clip_low_high`` is ``cfg.actor.eps_clip_low_high``
in the controller, in the Ray actors (which receive the group objects themselves) and in the loss. The command
configs (``RLConfig``, ``SFTConfig``, ``EvalCommandConfig``) hold the groups their command reads; building one fills
the dependent defaults and refuses combinations that would silently train the wrong thing, with a ``ConfigError``
naming the flags. ``parse(command, argv)`` is the command line's way in (a refused value exits with status 2).

To add a flag: a field in its group. To add a group (``--critic.*``): a frozen dataclass here, a ``group(...)``
field in the command configs that read it, its cross-flag rules in that command's ``_validate``.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from molt_train import flags
from molt_train.actor_backend import AUTOMODEL_INSTALL_HINT, BACKENDS
from molt_train.algorithms import ESTIMATORS, IS_LEVELS, IS_MODES, KL_ESTIMATORS, LOSS_AGG_MODES, POLICY_LOSSES
from molt_train.data import check_env_mix
from molt_train.engines.vllm import VLLM_INSTALL_HINT
from molt_train.engines.weight_buckets import BUCKET_BYTES
from molt_train.flags import ConfigError, group, option
from molt_train.parallel import FSDPConfig, check_fsdp

__all__ = ["COMMANDS", "ConfigError", "EvalCommandConfig", "RLConfig", "SFTConfig", "parse"]

RL = ("rl",)  # the commands that read a field (default: every command with its group)
GROUP_ESTIMATORS = ("reinforce_baseline", "rloo", "grpo", "dr_grpo")


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


@dataclass(frozen=True)
class AdamConfig:
    """AdamW of the policy."""

    lr: float = option(1e-6, "AdamW learning rate", minimum=0)
    betas: tuple[float, float] = option((0.9, 0.95), "AdamW betas")
    eps: float = option(1e-8, "AdamW eps", minimum=0)
    weight_decay: float = option(0.0, "AdamW weight decay", minimum=0)


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


@dataclass(frozen=True)
class AdvantageConfig:
    """Rewards -> advantages, and the IS correction of the train/rollout mismatch."""

    estimator: str = option("reinforce", "advantage estimator", choices=ESTIMATORS)
    gamma: float = option(1.0, "discount (reinforce)")
    no_whiten: bool = option(False, "skip advantage whitening")
    is_correction_level: str = option("off", "IS correction granularity", choices=IS_LEVELS)
    is_correction_mode: str = option("mask", "what happens outside the band", choices=IS_MODES)
    is_correction_threshold: tuple[float, ...] = option((0.5, 5.0), "[LOW] HIGH band on the IS ratio")


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
class RewardConfig:
    """Reward shaping before the estimator: a length penalty (at most one), then clipping."""

    clip_range: tuple[float, float] = option((-10.0, 10.0), "clip rewards to this range")
    overlong_buffer_len: int = option(
        0, "DAPO overlong penalty over the last N tokens of --data.max_len (0 = off)", minimum=0
    )
    overlong_penalty_factor: float = option(1.0, "maximum overlong penalty", minimum=0)
    stop_properly_penalty_coef: float | None = option(None, "truncated rollouts: reward*C (C in [0,1]) or C (C < 0)")


@dataclass(frozen=True)
class VLLMConfig:
    """The vLLM rollout engine (``--rollout.engine vllm``)."""

    num_engines: int = option(
        1,
        "vLLM engines; with --train.colocate_all all share the one GPU (requests go to the least busy, "
        "gpu_memory_utilization is split between them)",
        minimum=1,
    )
    tensor_parallel_size: int = option(
        1, "tensor-parallel GPUs per vLLM engine (its weights split over them)", minimum=1
    )
    data_parallel_size: int = option(
        1, "data-parallel replicas inside the vLLM engine (single node), each on tensor_parallel_size GPUs", minimum=1
    )
    enable_expert_parallel: bool = option(
        False, "MoE: split the experts over the engine's tensor_parallel_size x data_parallel_size GPUs (EP = TP x DP)"
    )
    gpu_memory_utilization: float = option(0.35, "fraction of GPU memory vLLM takes (weights + KV cache)")
    enforce_eager: bool = option(False, "no CUDA graphs / torch.compile (faster start, slower decode)")
    enable_prefix_caching: bool = option(False, "reuse KV of shared prefixes (reset at every weight sync)")
    max_num_batched_tokens: int | None = option(None, "scheduler token budget per step", minimum=1)
    max_num_seqs: int | None = option(None, "sequences decoded together at most", minimum=1)
    max_model_len: int | None = option(None, "context length the engine allocates for (default: --data.max_len)")
    dtype: str = option("bfloat16", "engine weight dtype", choices=("bfloat16", "float16", "float32", "auto"))
    mtp_num_speculative_tokens: int = option(0, "MTP speculative tokens (0 = off; needs an MTP checkpoint)", minimum=0)
    enable_sleep: bool = option(False, "free vLLM's GPU memory during training (sleep/wake each step)")
    bucket_mb: int = option(BUCKET_BYTES >> 20, "weight-sync bucket size in MiB (one transfer per bucket)", minimum=1)

    @property
    def bucket_bytes(self) -> int:
        return self.bucket_mb << 20

    @property
    def gpus_per_engine(self) -> int:
        """The GPUs one engine spans: tensor_parallel_size x data_parallel_size."""
        return self.tensor_parallel_size * self.data_parallel_size


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
        1, "rollout batches in flight ahead of training (rollout k+1 overlaps step k)", minimum=1, commands=RL
    )
    force_sync_mode: bool = option(
        False, "strictly on-policy: the next rollout starts only after the weight sync", commands=RL
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
    colocate_fsdp_models: bool = option(
        True,
        "the reference ranks share the policy ranks' GPUs (bundles); --no-train.colocate_fsdp_models gives them "
        "GPUs of their own",
        commands=RL,
    )


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
        None, "evaluate on at most this many rows (sft: 0 skips the final eval)", minimum=0
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
    data: DataConfig = group(DataConfig)
    rollout: RolloutConfig = group(RolloutConfig)
    algo: AlgoConfig = group(AlgoConfig)
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
        if not self.env and self.train.agent_path is None:
            raise ConfigError("no agent: pass --env ns/name-vN or --train.agent_path agent.py")
        if self.actor.model_name_or_path is None:
            raise ConfigError("--actor.model_name_or_path is required (e.g. runs/sft/hf from `molt-train sft`)")
        check_fsdp(self.fsdp, self.actor.num_workers, self.actor.backend)
        n = self.rollout.n_samples_per_prompt
        adv, algo, train = self.algo.advantage, self.algo, self.train
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
        low, high = self.actor.eps_clip_low_high
        if low < 0 or high < 0:
            raise ConfigError(f"--actor.eps_clip_low_high must be >= 0, got {low} {high}")
        if self.actor.dual_clip is not None and self.actor.dual_clip <= 1:
            raise ConfigError(f"--actor.dual_clip must be > 1 (recipes use 10), got {self.actor.dual_clip}")
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
        if not 0 < adv.gamma <= 1:
            raise ConfigError(f"--algo.advantage.gamma must be in (0, 1], got {adv.gamma}")
        self._validate_engine()
        self._validate_is_correction()
        _validate_reward(self.reward, self.data.max_len)
        if algo.kl.init_coef > 0 and algo.kl.ref == "rollout" and self.rollout.top_p < 1:
            raise ConfigError(
                f"--algo.kl.ref rollout reads the sampler's log-probs, which --rollout.top_p "
                f"{self.rollout.top_p} renormalises away; use --rollout.top_p 1.0 or --algo.kl.ref model"
            )
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

    def _validate_engine(self) -> None:
        """``--rollout.engine`` and what goes with it: vllm runs single-GPU engines, colocated (CUDA IPC weight
        sync) or on a GPU of their own (NCCL); a partial rollout is the vllm engine's pause/resume."""
        engine, train, vllm = self.rollout.engine, self.train, self.vllm
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
        if not 0.0 < vllm.gpu_memory_utilization <= 1.0:
            raise ConfigError(f"--vllm.gpu_memory_utilization must be in (0, 1], got {vllm.gpu_memory_utilization}")
        if vllm.mtp_num_speculative_tokens and vllm.enable_prefix_caching:
            raise ConfigError(
                "--vllm.mtp_num_speculative_tokens cannot be combined with --vllm.enable_prefix_caching; "
                "drop one of them"
            )
        if engine != "vllm":
            return
        check_engine_parallel(vllm, self.actor.num_workers, train.colocate_all)
        if vllm.num_engines != 1 and not train.colocate_all:
            raise ConfigError(
                f"--vllm.num_engines {vllm.num_engines} puts that many engines on the one GPU the trainer shares "
                "with them; add --train.colocate_all, or use --vllm.num_engines 1 for an engine on a GPU of its own"
            )
        if vllm.enable_sleep and not train.colocate_all:
            raise ConfigError(
                "--vllm.enable_sleep frees the GPU the engine shares with the trainer; with the engine on a GPU "
                "of its own (no --train.colocate_all) drop it"
            )
        if vllm.enable_sleep and not train.force_sync_mode:
            raise ConfigError(
                "--vllm.enable_sleep frees the engine while the trainer trains, so rollout and training must "
                "take turns: add --train.force_sync_mode"
            )
        if vllm.max_model_len < self.data.max_len:
            raise ConfigError(
                f"--vllm.max_model_len {vllm.max_model_len} is shorter than --data.max_len {self.data.max_len}; "
                "raise it or drop it (default: --data.max_len)"
            )

    def _validate_is_correction(self) -> None:
        """Refuse IS-correction settings that would silently train on biased updates."""
        adv, train = self.algo.advantage, self.train
        level, mode = adv.is_correction_level, adv.is_correction_mode
        if level in ("seq", "geo") and mode != "mask":
            raise ConfigError(
                f"--algo.advantage.is_correction_level {level!r} is a sequence rejection filter and needs "
                f"--algo.advantage.is_correction_mode 'mask', got {mode!r}; use level 'token' for clip/trunc"
            )
        queue = 0 if train.force_sync_mode else train.async_queue_size
        if level == "off" and (queue > 1 or train.partial_rollout_enable):
            raise ConfigError(
                f"async rollout (--train.async_queue_size={queue}, "
                f"--train.partial_rollout_enable={train.partial_rollout_enable}) trains on off-policy samples; "
                "enable --algo.advantage.is_correction_level (e.g. geo) or use --train.async_queue_size 1 without "
                "partial rollout"
            )
        if level != "off" and self.rollout.top_p < 1.0:
            raise ConfigError(
                f"IS correction needs --rollout.top_p 1.0, got {self.rollout.top_p}: nucleus renormalisation "
                "biases the rollout log-probs; set --rollout.top_p 1.0 or --algo.advantage.is_correction_level off"
            )
        band = adv.is_correction_threshold
        low, high = (0.0, *band) if len(band) == 1 else (band if len(band) == 2 else (None, None))
        if low is None or not 0.0 <= low < high:
            raise ConfigError(
                f"--algo.advantage.is_correction_threshold must be HIGH or LOW HIGH with 0 <= LOW < HIGH, got "
                f"{' '.join(map(str, band))} (recipes use 0.99 1.01)"
            )


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
        check_fsdp(self.fsdp, self.actor.num_workers, self.actor.backend)
        _require_installed(self.actor.backend, "hf")


@dataclass(frozen=True)
class EvalCommandConfig:
    """``molt-train eval``: a checkpoint's accuracy on an env's held-out split."""

    env: str | None = option(None, "registered env ID (ns/name-vN); its --eval.split gives the rows")
    actor: ActorConfig = group(ActorConfig, only=("model_name_or_path",))
    data: DataConfig = group(DataConfig, only=("max_len",))
    rollout: RolloutConfig = group(RolloutConfig, only=("max_new_tokens", "timeout_s", "max_batch_size"))
    train: TrainConfig = group(TrainConfig, only=("agent_path",))
    eval: EvalConfig = group(EvalConfig)

    def __post_init__(self) -> None:
        flags.check_declared(self, "eval")
        if self.actor.model_name_or_path is None:
            raise ConfigError("--actor.model_name_or_path is required (the checkpoint to score)")
        if self.env is None:
            raise ConfigError("pass --env ns/name-vN (its --eval.split gives the rows)")


COMMANDS: dict[str, type] = {"rl": RLConfig, "sft": SFTConfig, "eval": EvalCommandConfig}


def parse(command: str, argv: Sequence[str] | None) -> Any:
    """``command``'s config from ``argv``; a refused value exits with status 2 and a message naming the flag."""
    cls = COMMANDS[command]
    return flags.parse(cls, command, argv, description=cls.__doc__.splitlines()[0].replace("``", ""))


# -- rules several commands share --


def _set(cfg: Any, name: str, value: Any) -> None:
    """Fill a dependent default while the frozen config is being built."""
    object.__setattr__(cfg, name, value)


def check_engine_parallel(vllm: VLLMConfig, num_workers: int, colocated: bool) -> None:
    """Refuse a vLLM engine spread (``--vllm.tensor_parallel_size`` x ``--vllm.data_parallel_size`` GPUs) the run
    cannot place, naming the flags; the cluster's GPU count is checked when the run is placed (``plan_placement``).

    Raises:
        ConfigError: several engines of several GPUs each, expert parallelism over one GPU, or a colocated engine
            spanning more GPUs than the trainer ranks hold.
    """
    tp, dp, span = vllm.tensor_parallel_size, vllm.data_parallel_size, vllm.gpus_per_engine
    if span > 1 and vllm.num_engines != 1:
        raise ConfigError(
            f"--vllm.num_engines {vllm.num_engines} shares one GPU between engine processes; an engine of "
            f"--vllm.tensor_parallel_size {tp} x --vllm.data_parallel_size {dp} GPUs takes --vllm.num_engines 1"
        )
    if vllm.enable_expert_parallel and span == 1:
        raise ConfigError(
            "--vllm.enable_expert_parallel splits the experts over tensor_parallel_size x data_parallel_size GPUs, "
            "here 1 x 1: raise --vllm.tensor_parallel_size or --vllm.data_parallel_size, or drop it"
        )
    if colocated and span > num_workers:
        raise ConfigError(
            f"--train.colocate_all puts the vLLM engine on the trainer ranks' GPUs, one worker per GPU: "
            f"--vllm.tensor_parallel_size {tp} x --vllm.data_parallel_size {dp} = {span} GPUs, but "
            f"--actor.num_workers is {num_workers}; use --actor.num_gpus_per_node {span} or a smaller engine"
        )


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
