"""How the trainer's ranks split one model: ``--fsdp.*`` (tensor parallel and optimizer offload over FSDP2;
``--fsdp.cp_size`` / ``--fsdp.ep_size`` are flags that refuse anything but 1: context and expert parallelism are not
built).

The ranks of a ``WorkerGroup`` form a 2-D device mesh ``(dp, tp)``: ``--fsdp.tp_size`` ranks hold one model between
them (DTensor tensor parallelism inside every decoder layer: the attention's q/k/v and the MLP's gate/up projections
split by output column, o/down by input row, so each layer costs two all-reduces), and FSDP2 shards across the
``dp = num_workers / tp_size`` groups. Rank ``r`` is data-parallel rank ``r // tp_size``: the ranks of one TP group
read the same micro-batches. Embeddings, norms and the LM head stay whole on every TP rank (their gradients are
summed by FSDP2 over ``dp`` only), so the log-prob head sees the full vocabulary as before.

``--fsdp.offload optimizer`` keeps the sharded fp32 parameters, their gradients and the AdamW states in CPU memory
(FSDP2's ``CPUOffloadPolicy``): the optimizer step runs on the CPU and each layer's parameters are copied to the
GPU for its forward and backward, trading step time for the GPU memory of 12 bytes per parameter.

The CPU tests (gloo) check that a two-rank TP update equals the one-rank update and that the offloaded update equals
the plain one (``tests/molt_train/test_trainer_ray.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from molt_train.flags import option

OFFLOAD = ("none", "optimizer")
# decoder-layer projections by how tensor parallelism splits them (Llama / Qwen2 / Qwen3 / Mistral names)
COLUMN_PARALLEL = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj")
ROW_PARALLEL = ("self_attn.o_proj", "mlp.down_proj")


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
        "context-parallel ranks per sequence (not built: only 1 is accepted; see molt_train/README.md)",
        minimum=1,
    )
    ep_size: int = option(
        1,
        "expert-parallel ranks per MoE layer (not built: only 1 is accepted; see molt_train/README.md)",
        minimum=1,
    )
    offload: str = option(
        "none",
        "optimizer: fp32 master weights, gradients and AdamW states in CPU memory (FSDP2 CPUOffloadPolicy; "
        "the optimizer step runs on the CPU)",
        choices=OFFLOAD,
    )


def check_fsdp(fsdp: FSDPConfig, num_workers: int, backend: str, lora_dim: int = 0) -> None:
    """Refuse a split the ranks cannot make, naming the flags (the model's head counts are checked at load);
    ``lora_dim``: ``--model.lora_dim`` (PEFT adapters wrap the projections the TP plan splits)."""
    from molt_train.flags import ConfigError

    if num_workers % fsdp.tp_size:
        raise ConfigError(
            f"--fsdp.tp_size {fsdp.tp_size} must divide --actor.num_workers {num_workers} "
            f"(each tensor-parallel group holds one copy of the model); use e.g. --actor.num_workers {fsdp.tp_size}"
        )
    if fsdp.cp_size > 1:
        raise ConfigError(
            f"--fsdp.cp_size {fsdp.cp_size}: context parallelism is not built in this trainer (torch's "
            "context_parallel shards only CUDA SDPA kernels, and NeMo AutoModel's ContextParallelSharder is not wired "
            f"in for --actor.backend {backend}); use --fsdp.cp_size 1 and a --data.max_len that fits one rank"
        )
    if fsdp.ep_size > 1:
        raise ConfigError(
            f"--fsdp.ep_size {fsdp.ep_size}: expert parallelism is not built in this trainer (--actor.backend "
            f"{backend} keeps every expert on every rank, sharded by FSDP2); use --fsdp.ep_size 1"
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


def device_mesh(device_type: str, world_size: int, fsdp: FSDPConfig) -> Any:
    """The ``(dp, tp)`` mesh of ``world_size`` ranks."""
    from torch.distributed.device_mesh import init_device_mesh

    tp = fsdp.tp_size
    return init_device_mesh(device_type, (world_size // tp, tp), mesh_dim_names=("dp", "tp"))


def tensor_parallel(model: Any, tp_mesh: Any) -> None:
    """Split every decoder layer of ``model`` (an HF causal LM) over ``tp_mesh`` in place."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    size = tp_mesh.size()
    config = model.config
    heads, kv_heads = config.num_attention_heads, getattr(config, "num_key_value_heads", None) or 0
    if heads % size or kv_heads % size:
        raise ValueError(
            f"--fsdp.tp_size {size} must divide the model's attention heads ({heads}) and key/value heads "
            f"({kv_heads}); pick a tp_size that divides both"
        )
    plan = {name: ColwiseParallel() for name in COLUMN_PARALLEL} | {name: RowwiseParallel() for name in ROW_PARALLEL}
    for layer in model.model.layers:
        missing = [name for name in plan if not _has_submodule(layer, name)]
        if missing:
            raise ValueError(
                f"--fsdp.tp_size {size}: {type(model).__name__}'s decoder layers have no {missing} (tensor "
                "parallelism here knows Llama/Qwen-style projections); use --fsdp.tp_size 1"
            )
        parallelize_module(layer, tp_mesh, plan)


def _has_submodule(module: torch.nn.Module, name: str) -> bool:
    try:
        module.get_submodule(name)
    except AttributeError:
        return False
    return True


def offload_policy(fsdp: FSDPConfig, pin_memory: bool) -> Any:
    """FSDP2's offload policy for ``--fsdp.offload`` (``pin_memory`` on a GPU: faster host-device copies)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy

    return CPUOffloadPolicy(pin_memory=pin_memory) if fsdp.offload == "optimizer" else OffloadPolicy()


def clip_grad_norm(parameters: list[torch.nn.Parameter], max_norm: float) -> float:
    """Clip the gradients of ``parameters`` to a total L2 norm of ``max_norm``; returns the norm before clipping.

    Under tensor parallelism the parameters live on two meshes (``(dp, tp)`` for the split projections, ``dp`` for
    the rest), which one ``clip_grad_norm_`` cannot combine: the norm is taken per mesh, made whole, and summed.
    """
    by_mesh: dict[Any, list[torch.nn.Parameter]] = {}
    for p in parameters:
        if p.grad is not None:
            by_mesh.setdefault(getattr(p.grad, "device_mesh", None), []).append(p)
    norms = []
    for params in by_mesh.values():
        norm = torch.nn.utils.get_total_norm([p.grad for p in params], 2.0)
        norms.append(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
    total = torch.linalg.vector_norm(torch.stack([n.float().cpu() for n in norms]))
    if max_norm != float("inf"):
        for params in by_mesh.values():
            torch.nn.utils.clip_grads_with_norm_(params, max_norm, total.to(params[0].grad.device))
    return float(total)
