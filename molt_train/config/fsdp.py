"""The ``--fsdp.*`` flag group (``FSDPConfig``: how the trainer's FSDP2 ranks split one model) and its rules
(``check_fsdp``). What the split does is ``molt_train/parallel.py``'s (tensor, expert and context parallelism, optimizer
offload).
"""

from __future__ import annotations

from dataclasses import dataclass

from molt_train.config.flags import ConfigError, option

OFFLOAD = ("none", "optimizer")
ATTN_IMPLEMENTATIONS = ("sdpa", "eager", "flash_attention_2", "te")


@dataclass(frozen=True)
class FSDPConfig:
    """How the trainer's FSDP2 ranks split the model (``--actor.num_workers`` ranks in all)."""

    tp_size: int = option(
        1,
        "tensor-parallel ranks per model copy (DTensor TP in each decoder layer; FSDP2 shards over "
        "--actor.num_workers / tp_size groups); must divide --actor.num_workers and the head counts",
        minimum=1,
    )
    cp_size: int = option(
        1,
        "context-parallel ranks per sequence (each holds 1/cp of every row; all-to-all attention over heads, "
        "molt_train/context_parallel.py); must divide --actor.num_workers and the head counts",
        minimum=1,
    )
    ep_size: int = option(
        1,
        "expert-parallel ranks per MoE layer (--actor.backend hf: each holds num_experts / ep_size whole experts and "
        "reads its own micro-batches; tokens reach their experts by all-to-all); must divide --actor.num_workers and "
        "the model's expert count",
        minimum=1,
    )
    offload: str = option(
        "none",
        "optimizer: fp32 master weights, gradients and AdamW states in CPU memory (FSDP2 CPUOffloadPolicy; "
        "the optimizer step runs on the CPU)",
        choices=OFFLOAD,
    )
    attn_implementation: str = option(
        "sdpa",
        "the trainer's attention kernel: sdpa | eager (transformers, CPU or GPU) | flash_attention_2 (needs CUDA "
        "and flash-attn) | te (TransformerEngine: needs --actor.backend automodel)",
        choices=ATTN_IMPLEMENTATIONS,
    )
    packing_samples: bool = option(
        False,
        "pack several rows into one sequence (THD); not built here (refused): each micro-batch pads its rows, "
        "bounded by --train.max_tokens_per_gpu",
    )


def check_fsdp(fsdp: FSDPConfig, num_workers: int, backend: str, lora_dim: int = 0) -> None:
    """Refuse a split the ranks cannot make, naming the flags (the model's head counts are checked at load);
    ``lora_dim``: ``--model.lora_dim`` (PEFT adapters wrap the projections the TP plan splits)."""
    if num_workers % fsdp.tp_size:
        raise ConfigError(
            f"--fsdp.tp_size {fsdp.tp_size} must divide --actor.num_workers {num_workers} "
            f"(each tensor-parallel group holds one copy of the model); use e.g. --actor.num_workers {fsdp.tp_size}"
        )
    if fsdp.cp_size > 1:
        if num_workers % fsdp.cp_size:
            raise ConfigError(
                f"--fsdp.cp_size {fsdp.cp_size} must divide --actor.num_workers {num_workers} (each context-parallel "
                f"group splits its sequences over cp ranks); use e.g. --actor.num_workers {fsdp.cp_size}"
            )
        if backend != "hf":
            raise ConfigError(
                f"--fsdp.cp_size {fsdp.cp_size} splits transformers' attention (--actor.backend hf); --actor.backend "
                f"{backend} is not split by sequence here: use --fsdp.cp_size 1"
            )
        if fsdp.tp_size > 1 or fsdp.ep_size > 1:
            raise ConfigError(
                f"--fsdp.cp_size {fsdp.cp_size} with --fsdp.tp_size {fsdp.tp_size} / --fsdp.ep_size {fsdp.ep_size}: "
                "context parallelism composes with FSDP2 only here; use one of them"
            )
    if fsdp.ep_size > 1:
        if num_workers % fsdp.ep_size:
            raise ConfigError(
                f"--fsdp.ep_size {fsdp.ep_size} must divide --actor.num_workers {num_workers} (each expert-parallel "
                f"group holds every expert once); use e.g. --actor.num_workers {fsdp.ep_size}"
            )
        if backend != "hf":
            raise ConfigError(
                f"--fsdp.ep_size {fsdp.ep_size} splits transformers' MoE experts (--actor.backend hf); --actor.backend "
                f"{backend} keeps every expert on every rank, sharded by FSDP2: use --fsdp.ep_size 1"
            )
        if fsdp.tp_size > 1:
            raise ConfigError(
                f"--fsdp.ep_size {fsdp.ep_size} with --fsdp.tp_size {fsdp.tp_size}: expert and tensor parallelism "
                "together are not built here; use one of them"
            )
        if lora_dim:
            raise ConfigError(
                f"--fsdp.ep_size {fsdp.ep_size} with --model.lora_dim {lora_dim}: PEFT adapters on split experts are "
                "not built; drop one of them"
            )
    if fsdp.tp_size > 1 and backend != "hf":
        raise ConfigError(
            f"--fsdp.tp_size {fsdp.tp_size} splits transformers' decoder layers (--actor.backend hf); "
            f"--actor.backend {backend} is not split here: use --fsdp.tp_size 1"
        )
    if fsdp.tp_size > 1 and lora_dim:
        raise ConfigError(
            f"--fsdp.tp_size {fsdp.tp_size} splits the decoder's nn.Linear projections, which --model.lora_dim "
            f"{lora_dim} wraps in PEFT adapter layers the split does not cover: drop one of them"
        )


def check_attention(fsdp: FSDPConfig, backend: str, flash_attn_installed: bool) -> None:
    """``--fsdp.attn_implementation`` and ``--fsdp.packing_samples``: refuse what needs a kernel, package or GPU the
    run does not have, naming what it needs (never a silent fallback to sdpa)."""
    attn = fsdp.attn_implementation
    if fsdp.packing_samples:
        raise ConfigError(
            "--fsdp.packing_samples: sample packing (THD streams) is not built here; each micro-batch pads its rows "
            "to the longest (--train.max_tokens_per_gpu bounds it): drop it"
        )
    if attn == "te" and backend != "automodel":
        raise ConfigError(
            "--fsdp.attn_implementation te is TransformerEngine attention, which NVIDIA AutoModel's models use: it "
            "needs --actor.backend automodel (a CUDA GPU, nemo_automodel and transformer_engine); with "
            "--actor.backend hf use --fsdp.attn_implementation sdpa (or flash_attention_2 on a GPU)"
        )
    if attn == "flash_attention_2" and not flash_attn_installed:
        raise ConfigError(
            "--fsdp.attn_implementation flash_attention_2 needs the flash-attn package and a CUDA GPU (flash_attn is "
            "not importable in this environment): pip install flash-attn on a GPU machine, or use "
            "--fsdp.attn_implementation sdpa"
        )
    if attn != "sdpa" and fsdp.cp_size > 1:
        raise ConfigError(
            f"--fsdp.cp_size {fsdp.cp_size} replaces the attention with its all-to-all (molt_cp), so "
            f"--fsdp.attn_implementation {attn} would not act; drop one of them"
        )
