"""Context parallelism (``--fsdp.cp_size``): the ranks of a context-parallel group split every sequence of a
micro-batch into ``cp`` contiguous chunks, one each, so a rank holds ``1/cp`` of the activations.

Attention is the only place a token meets the others. It runs as all-to-all attention over heads (the DeepSpeed
Ulysses scheme): before it, an all-to-all turns each rank's (all heads, its chunk) q/k/v into (``1/cp`` of the heads,
the whole sequence); the whole causal attention of those heads runs there with the model's own SDPA path; a second
all-to-all turns the output back into (all heads, its chunk). Both all-to-alls are differentiable, so the backward is
the same computation mirrored. It is registered as the transformers attention implementation ``molt_cp`` and needs
the attention and key/value head counts to be multiples of ``cp``. Any attention kernel works, gloo on the CPU too.

Every rank computes its chunk's next-token log-probs; they are gathered (differentiably) into the whole ``(N, L-1)``
rows, so the loss code is unchanged. Each rank of a group then holds the same loss; the gather's backward sums the
group's ``cp`` identical gradients, and FSDP2 averaging over ``dp * cp`` ranks divides that factor out again, so the
update is the one of one rank holding the whole sequence (``tests/molt_train/test_trainer_ray.py`` checks it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F
from torch import Tensor

IMPLEMENTATION = "molt_cp"
# torch 2.13 renamed the differentiable all-gather (2.11, vLLM's, has the old name only)
_all_gather = getattr(funcol, "all_gather_single_autograd", None) or funcol.all_gather_tensor_autograd


def _all_to_all(x: Tensor, group: Any) -> Tensor:
    """Differentiable all-to-all over dim 0 (one slice per rank of ``group``)."""
    return funcol.all_to_all_single_autograd(x.contiguous(), None, None, group)


def _seq_to_heads(x: Tensor, group: Any) -> Tensor:
    """(N, H, s, D), this rank's chunk of every head -> (N, H/cp, cp*s, D), its heads over the whole sequence."""
    cp = dist.get_world_size(group)
    n, h, s, d = x.shape
    out = _all_to_all(x.reshape(n, cp, h // cp, s, d).transpose(0, 1), group)  # out[j]: rank j's chunk, our heads
    return out.permute(1, 2, 0, 3, 4).reshape(n, h // cp, cp * s, d)


def _heads_to_seq(x: Tensor, group: Any) -> Tensor:
    """(N, cp*s, h, D), this rank's heads over the whole sequence -> (N, s, cp*h, D), every head of its chunk."""
    cp = dist.get_world_size(group)
    n, length, h, d = x.shape
    out = _all_to_all(x.reshape(n, cp, length // cp, h, d).transpose(0, 1), group)  # out[j]: rank j's heads
    return out.permute(1, 2, 0, 3, 4).reshape(n, length // cp, cp * h, d)


def cp_attention(
    module: torch.nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    molt_cp: tuple[Any, Tensor] | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """The attention of one decoder layer on a sequence chunk (transformers' attention interface; ``molt_cp``: the
    group and the whole rows' ``(N, L)`` key mask, passed through the model's forward kwargs)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if molt_cp is None:
        raise RuntimeError(f"attention {IMPLEMENTATION!r} runs inside ContextParallel.forward only")
    group, valid = molt_cp
    q, k, v = (_seq_to_heads(t, group) for t in (query, key, value))
    length = q.shape[2]
    causal = torch.ones(length, length, dtype=torch.bool, device=q.device).tril()
    # each query sees the valid keys before it, and itself (a padding row then gets a finite, unused output)
    mask = (causal & valid[:, None, :]) | torch.eye(length, dtype=torch.bool, device=q.device)
    out, _ = sdpa_attention_forward(module, q, k, v, mask[:, None], dropout=dropout, scaling=scaling, is_causal=False)
    return _heads_to_seq(out, group), None


def enable(lm: torch.nn.Module, cp_size: int) -> None:
    """Switch ``lm`` (an HF causal LM) to ``cp_attention``, after checking its heads split ``cp_size`` ways.

    Raises:
        ValueError: a head count that ``cp_size`` does not divide, or sliding-window attention.
    """
    from transformers import AttentionInterface

    config = lm.config
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    if heads % cp_size or kv_heads % cp_size:
        raise ValueError(
            f"--fsdp.cp_size {cp_size} must divide the model's {heads} attention heads and {kv_heads} key/value "
            "heads (each rank attends with its share of them); use a --fsdp.cp_size that divides both"
        )
    if (
        getattr(config, "use_sliding_window", False)
        or getattr(config, "layer_types", None)
        and any(t != "full_attention" for t in config.layer_types)
    ):
        raise ValueError(f"--fsdp.cp_size {cp_size}: sliding-window attention layers are not built here; use 1")
    AttentionInterface.register(IMPLEMENTATION, cp_attention)
    lm.set_attn_implementation(IMPLEMENTATION)


def logprobs(
    model: torch.nn.Module,
    logp: Callable[[Tensor, Tensor, float], Tensor],
    input_ids: Tensor,
    attention_mask: Tensor,
    positions: Tensor,
    temperature: float,
    group: Any,
) -> Tensor:
    """The rows' next-token log-probs ``(N, L-1)``, this rank of ``group`` running the decoder ``model`` (an HF
    ``lm.model`` under ``enable``) on its chunk only; ``logp(hidden, targets, temperature)`` scores a chunk."""
    cp, rank = dist.get_world_size(group), dist.get_rank(group)
    length = input_ids.shape[1]
    extra = -length % cp  # the rows right-padded to a multiple of cp (keys masked, log-probs cut off)
    ids, valid, positions = (F.pad(t, (0, extra)) for t in (input_ids, attention_mask, positions))
    targets = F.pad(input_ids[:, 1:], (0, extra + 1))  # position t's next token, whole rows
    chunk = ids.shape[1] // cp
    part = slice(rank * chunk, (rank + 1) * chunk)
    hidden = model(
        input_ids=ids[:, part], position_ids=positions[..., part], use_cache=False, molt_cp=(group, valid.bool())
    )[0]
    local = logp(hidden, targets[:, part], temperature)
    return _all_gather(local.contiguous(), 1, group)[:, : length - 1]
