"""How the trainer's ranks split one model: ``--fsdp.*`` (tensor parallel, expert parallel and optimizer offload over
FSDP2; ``--fsdp.cp_size`` splits every sequence, ``molt_train/context_parallel.py``). The flags and the splits they
refuse are ``molt_train/config/fsdp.py``'s.

The ranks of a ``WorkerGroup`` form a device mesh ``(dp, tp, cp)``: ``--fsdp.tp_size`` ranks hold one model between
them (DTensor tensor parallelism inside every decoder layer: the attention's q/k/v and the MLP's gate/up projections
split by output column, o/down by input row, so each layer costs two all-reduces), and FSDP2 shards across the
``dp = num_workers / tp_size`` groups. Rank ``r`` is data-parallel rank ``r // tp_size``: the ranks of one TP group
read the same micro-batches. Embeddings, norms and the LM head stay whole on every TP rank (their gradients are
summed by FSDP2 over ``dp`` only), so the log-prob head sees the full vocabulary as before. The ``--fsdp.cp_size``
ranks of a context-parallel group read the same micro-batches too, each running its chunk of every sequence, and
FSDP2 shards over ``dp * cp`` (``molt_train/context_parallel.py`` says why the update stays the one-rank update).

``--fsdp.ep_size`` splits an MoE model's experts (``--actor.backend hf``, transformers' own expert parallelism:
``transformers.distributed.expert_parallel.apply_expert_parallelism`` with the model's ``base_model_ep_plan`` and the
``all_to_all`` implementation). The ``ep_size`` ranks of an expert group hold ``num_experts / ep_size`` whole experts
each (the stacked expert weights become DTensors ``Shard(0)`` on the expert dim) and stay data-parallel ranks: each
reads its own micro-batches, and every MoE layer sends each (token, expert) pair to the expert's rank and the result
back (two all-to-alls, differentiable). Dense parameters stay FSDP2-sharded over all ranks; the expert parameters are
kept out of FSDP2 (``ignored_params``) and ``reduce_expert_grads`` makes their gradients the whole batch's: the
all-to-all backward already sums the gradient over the expert group's tokens, so it is summed over the
``num_workers / ep_size`` groups holding the same experts (an all-reduce; none when ``ep_size == num_workers``) and
divided by the data-parallel size the loss was scaled by. ``clip_grad_norm`` takes the experts' norm on their own
mesh, and the full state dict (checkpoints, weight sync) gathers them like any DTensor.

``--fsdp.offload optimizer`` keeps the sharded fp32 parameters, their gradients and the AdamW states in CPU memory
(FSDP2's ``CPUOffloadPolicy``): the optimizer step runs on the CPU and each layer's parameters are copied to the
GPU for its forward and backward, trading step time for the GPU memory of 12 bytes per parameter.

The CPU tests (gloo) check that a two-rank TP update and a two-rank EP update (a tiny Qwen3-MoE) equal the one-rank
update and that the offloaded update equals the plain one (``tests/molt_train/test_trainer_ray.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from molt_train.config.fsdp import FSDPConfig

# decoder-layer projections by how tensor parallelism splits them (Llama / Qwen2 / Qwen3 / Mistral names)
COLUMN_PARALLEL = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj")
ROW_PARALLEL = ("self_attn.o_proj", "mlp.down_proj")
# MoE config fields holding the experts per layer (Qwen3-MoE / Qwen2-MoE, Mixtral, DeepSeek)
EXPERT_COUNTS = ("num_experts", "num_local_experts", "n_routed_experts")


def device_mesh(device_type: str, world_size: int, fsdp: FSDPConfig) -> Any:
    """The ``(dp, tp, cp)`` mesh of ``world_size`` ranks (``dp``: the groups reading different micro-batches)."""
    from torch.distributed.device_mesh import init_device_mesh

    tp, cp = fsdp.tp_size, fsdp.cp_size
    return init_device_mesh(device_type, (world_size // (tp * cp), tp, cp), mesh_dim_names=("dp", "tp", "cp"))


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


def expert_mesh(device_type: str, world_size: int, ep_size: int) -> Any:
    """The ``(replica, ep, solo)`` mesh of ``world_size`` ranks: ``ep`` groups of ``ep_size`` ranks that hold every
    expert once between them, ``replica`` the groups holding the same experts, ``solo`` each rank alone (the ranks
    sharing one batch, transformers' ``tp_mesh`` argument: here none share one)."""
    from torch.distributed.device_mesh import init_device_mesh

    shape = (world_size // ep_size, ep_size, 1)
    return init_device_mesh(device_type, shape, mesh_dim_names=("replica", "ep", "solo"))


def expert_parallel(model: Any, mesh: Any) -> list[torch.nn.Parameter]:
    """Split the experts of ``model`` (an HF MoE causal LM) over ``mesh["ep"]`` in place, with transformers'
    ``apply_expert_parallelism`` and the model's ``base_model_ep_plan`` (its names are relative to ``model.model``);
    returns the expert parameters (DTensors ``Shard(0)`` on the ep mesh), which FSDP2 must leave alone."""
    from torch.distributed.tensor import DTensor
    from transformers.distributed.expert_parallel import apply_expert_parallelism

    ep_mesh = mesh["ep"]
    size = ep_mesh.size()
    base = model.model
    check_experts(base.config, size)
    expanded = base._expand_parallel_plan(base.config.base_model_ep_plan)
    params = dict(base.named_parameters())
    if not any(style == "grouped_gemm" and name in params for name, style in expanded.items()):
        raise ValueError(
            f"--fsdp.ep_size {size}: {type(model).__name__}'s expert plan names no stacked expert weights of this "
            "model; use --fsdp.ep_size 1"
        )
    apply_expert_parallelism(base, ep_mesh, mesh["solo"], expanded, ep_implementation="all_to_all")
    return [p for p in model.parameters() if isinstance(p, DTensor)]


def check_experts(config: Any, ep_size: int) -> int:
    """The experts per MoE layer of a model with ``config``, refusing one ``--fsdp.ep_size`` cannot split: no expert
    plan with a token dispatch (a dense model), or an expert count ``ep_size`` does not divide."""
    plan = getattr(config, "base_model_ep_plan", None) or {}
    experts = next((getattr(config, k) for k in EXPERT_COUNTS if getattr(config, k, None)), 0)
    if "ep_dispatch_experts" not in plan.values() or not experts:
        raise ValueError(
            f"--fsdp.ep_size {ep_size}: a {type(config).__name__} model has no experts to split (no "
            "base_model_ep_plan with a token dispatch, or no expert count); use --fsdp.ep_size 1 for a dense model"
        )
    if experts % ep_size:
        raise ValueError(
            f"--fsdp.ep_size {ep_size} must divide the model's {experts} experts per layer; pick an ep_size that "
            "divides it"
        )
    return experts


def reduce_expert_grads(params: list[torch.nn.Parameter], mesh: Any, dp_size: int) -> None:
    """Make the expert gradients those of the whole step, as FSDP2 does for the dense ones: the all-to-all backward
    summed each expert's gradient over its expert group's tokens, of losses scaled by ``dp_size`` (FSDP2 averages
    over the data-parallel ranks); sum it over the groups holding the same experts, divide by ``dp_size``."""
    import torch.distributed as dist

    replicas = mesh["replica"]
    for p in params:
        if not p.requires_grad:
            continue
        if p.grad is None:  # no token of this rank's group reached the layer: a zero share, every rank must reduce
            p.grad = torch.zeros_like(p)
        local = p.grad.to_local()
        if replicas.size() > 1:
            dist.all_reduce(local, group=replicas.get_group())
        local.div_(dp_size)


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
    the rest; under expert parallelism ``ep`` for the experts), which one ``clip_grad_norm_`` cannot combine: the norm
    is taken per mesh, made whole, and summed.
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
