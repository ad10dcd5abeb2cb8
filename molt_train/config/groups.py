"""The flag groups every command shares: one frozen dataclass per ``--GROUP.*`` (its fields are the flags).

``--ray.*``, ``--model.*``, ``--actor.*`` (with ``--actor.adam.*``), ``--ref.*``, ``--data.*``, ``--rollout.*``,
``--train.*``, ``--ckpt.*``, ``--eval.*``, ``--logger.*``, ``--judge.*``. The algorithm's groups are in ``algo.py``,
the vllm engine's in ``engine.py``, the model split's in ``fsdp.py``; the command configs that hold them, and the
rules across groups, in ``commands.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

from molt_train.actor_backend import BACKENDS
from molt_train.algorithms.losses import LOSS_AGG_MODES, POLICY_LOSSES
from molt_train.config.flags import group, option

RL = ("rl",)  # the commands that read a field (default: every command with its group)


@dataclass(frozen=True)
class AdamConfig:
    """AdamW settings (``--actor.adam.*``, ``--critic.adam.*``)."""

    lr: float = option(1e-6, "AdamW learning rate", minimum=0)
    betas: tuple[float, float] = option((0.9, 0.95), "AdamW betas")
    eps: float = option(1e-8, "AdamW eps", minimum=0)
    weight_decay: float = option(0.0, "AdamW weight decay", minimum=0)


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
    lora_dim: int = option(
        0, "LoRA rank: train PEFT adapters only (0 = full fine-tuning)", minimum=0, aliases=("actor.lora_dim",)
    )
    lora_alpha: float = option(
        16.0,
        "LoRA scale numerator (the adapter is scaled by alpha / rank)",
        minimum=0,
        aliases=("actor.lora_alpha",),
    )
    lora_target_modules: tuple[str, ...] = option(
        (),
        "LoRA targets: globs over full module names, e.g. '*.q_proj' '*.v_proj' (default: every linear layer)",
        aliases=("actor.lora_target_modules",),
    )


@dataclass(frozen=True)
class ActorConfig:
    """The policy: its checkpoint, FSDP2 ranks, optimizer, schedule and policy loss."""

    model_name_or_path: str | None = option(
        None, "HF checkpoint directory of the policy", aliases=("model.model_name_or_path",)
    )
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
    num_nodes: int = option(
        1,
        "nodes of the reference ranks: they are placed with the policy's on the cluster Ray gives (--ray.address), "
        "so only 1 is accepted",
        minimum=1,
    )
    num_gpus_per_node: int = option(
        0,
        "GPUs of the reference ranks' own (one rank per policy rank, so it must equal --actor.num_workers; turns "
        "--train.colocate_fsdp_models off); 0 = they share the policy ranks' GPUs",
        minimum=0,
    )


@dataclass(frozen=True)
class DataConfig:
    """Training rows: the env's split or a JSONL file, and the context length."""

    prompt_dataset: str | None = option(
        None, "JSONL file of prompts, overriding the env's train split", aliases=("data.dataset",)
    )
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
    force_on_policy: bool = option(
        False,
        "FlashREINFORCE's switch (with --algo.advantage.estimator flash_reinforce): train strictly on-policy",
        commands=RL,
    )
    batch_invariant: bool = option(
        False,
        "batch-invariant kernels, so the trainer's log-probs equal the rollout's bit for bit (needs vLLM's "
        "batch-invariant kernels on CUDA; not built here: refused)",
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
