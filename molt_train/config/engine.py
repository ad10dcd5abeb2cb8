"""The ``--vllm.*`` flag group (``VLLMConfig``, what the vllm rollout engine is built with) and every rule on the
rollout engine's flags (``--rollout.engine``, ``--vllm.*``, ``--train.partial_rollout_enable``).

``groups.py`` holds the shared groups and ``commands.py`` the command configs; ``RLConfig`` calls ``validate_engine``
once its dependent defaults (``--vllm.max_model_len``) are filled. The engines (``molt_train/engines/``) read this
group, its default bucket size (``BUCKET_BYTES``) and its install hint from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from molt_train.config.flags import ConfigError, option
from molt_train.config.groups import ActorConfig, DataConfig, RolloutConfig, TrainConfig

BUCKET_BYTES = 512 << 20  # a weight-sync bucket (--vllm.bucket_mb's default)
VLLM_INSTALL_HINT = (
    "--rollout.engine vllm needs vLLM (a CUDA build, e.g. vllm==0.24.0 with torch 2.11): "
    "pip install vllm, or use --rollout.engine hf"
)


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
    compile: bool = option(
        True,
        "torch.compile the engine's model and capture piecewise + full CUDA graphs (vLLM's default); "
        "--no-vllm.compile: full CUDA graphs of decode batches only, no compilation (a faster start, eager prefill)",
    )
    enable_prefix_caching: bool = option(False, "reuse KV of shared prefixes (reset at every weight sync)")
    max_num_batched_tokens: int | None = option(None, "scheduler token budget per step", minimum=1)
    max_num_seqs: int | None = option(None, "sequences decoded together at most", minimum=1)
    max_model_len: int | None = option(None, "context length the engine allocates for (default: --data.max_len)")
    dtype: str = option("bfloat16", "engine weight dtype", choices=("bfloat16", "float16", "float32", "auto"))
    mtp_num_speculative_tokens: int = option(0, "MTP speculative tokens (0 = off; needs an MTP checkpoint)", minimum=0)
    enable_sleep: bool = option(False, "free vLLM's GPU memory during training (sleep/wake each step)")
    moe_backend: str | None = option(
        None, "vLLM's MoE kernel backend, e.g. triton (default: vLLM chooses; passed to vLLM as moe_backend)"
    )
    bucket_mb: int = option(BUCKET_BYTES >> 20, "weight-sync bucket size in MiB (one transfer per bucket)", minimum=1)

    @property
    def bucket_bytes(self) -> int:
        return self.bucket_mb << 20

    @property
    def gpus_per_engine(self) -> int:
        """The GPUs one engine spans: tensor_parallel_size x data_parallel_size."""
        return self.tensor_parallel_size * self.data_parallel_size


class EngineRuleInputs(Protocol):
    """The groups the rollout engine's rules read of a command config (``RLConfig`` has them all). A protocol, not
    ``RLConfig`` itself, so that this module stays below ``commands.py``, which calls it."""

    @property
    def actor(self) -> ActorConfig: ...
    @property
    def data(self) -> DataConfig: ...
    @property
    def rollout(self) -> RolloutConfig: ...
    @property
    def train(self) -> TrainConfig: ...
    @property
    def vllm(self) -> VLLMConfig: ...


def validate_engine(cfg: EngineRuleInputs) -> None:
    """``--rollout.engine`` and what goes with it: vllm runs engines colocated (CUDA IPC weight sync) or on GPUs
    of their own (NCCL), one GPU each or one engine of tensor_parallel_size x data_parallel_size GPUs
    (``check_engine_parallel``); a partial rollout is the vllm engine's pause/resume."""
    engine, train, vllm = cfg.rollout.engine, cfg.train, cfg.vllm
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
            "--vllm.mtp_num_speculative_tokens cannot be combined with --vllm.enable_prefix_caching; drop one of them"
        )
    if engine != "vllm":
        return
    if cfg.rollout.num_workers != 1:
        raise ConfigError(f"--rollout.num_workers {cfg.rollout.num_workers} needs --rollout.engine hf")
    check_engine_parallel(vllm, cfg.actor.num_workers, train.colocate_all)
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
    if vllm.enable_sleep and not train.on_policy:
        raise ConfigError(
            "--vllm.enable_sleep frees the engine while the trainer trains, so rollout and training must "
            "take turns: add --train.force_sync_mode"
        )
    if vllm.max_model_len < cfg.data.max_len:
        raise ConfigError(
            f"--vllm.max_model_len {vllm.max_model_len} is shorter than --data.max_len {cfg.data.max_len}; "
            "raise it or drop it (default: --data.max_len)"
        )


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
