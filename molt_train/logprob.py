"""Per-token log-probs of chosen tokens through the LM head, chunk by chunk, with a hand-written backward.

``log p(t) = z_t - logsumexp(z)`` with ``z = (h @ W^T) / T`` computed in fp32 from the head's (bf16 on GPU) logits.
The forward keeps no logits, only each position's log-sum-exp. The backward recomputes a chunk's logits and forms
their gradient ``g * (onehot(t) - softmax(z)) / T`` in one elementwise pass from the saved log-sum-exp, so the
full-vocabulary logits of the batch never exist at once, nothing of the forward is redone but the head's matmul,
and (compiled) each chunk's fp32 logits are never written to memory.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor


def _forward_chunk(logits: Tensor, targets: Tensor, temperature: float) -> tuple[Tensor, Tensor]:
    z = logits.float() / temperature
    lse = z.logsumexp(-1)
    return z.gather(-1, targets[:, None])[:, 0] - lse, lse


def _backward_chunk(logits: Tensor, targets: Tensor, lse: Tensor, grad: Tensor, temperature: float) -> Tensor:
    p = (logits.float() / temperature - lse[:, None]).exp()
    chosen = torch.arange(p.shape[-1], device=p.device)[None, :] == targets[:, None]
    return (torch.where(chosen, 1 - p, -p) * (grad / temperature)[:, None]).to(logits.dtype)


class ChunkedLogProb(torch.autograd.Function):
    """``apply(hidden (N, H), weight (V, H), targets (N,), temperature, chunk_size, kernels)`` -> log-probs (N,) fp32.
    ``kernels``: the (forward, backward) chunk functions, eager or compiled (``chunk_kernels``)."""

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, targets: Tensor, temperature: float, chunk_size: int,
                kernels: tuple[Callable, Callable]) -> Tensor:
        logp = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
        lse = torch.empty_like(logp)
        for s in range(0, hidden.shape[0], chunk_size):
            e = s + chunk_size
            logp[s:e], lse[s:e] = kernels[0](hidden[s:e] @ weight.t(), targets[s:e], temperature)
        ctx.save_for_backward(hidden, weight, targets, lse)
        ctx.temperature, ctx.chunk_size, ctx.kernel = temperature, chunk_size, kernels[1]
        return logp

    @staticmethod
    def backward(ctx, grad: Tensor):
        hidden, weight, targets, lse = ctx.saved_tensors
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) \
            if ctx.needs_input_grad[1] else None
        for s in range(0, hidden.shape[0], ctx.chunk_size):
            e = s + ctx.chunk_size
            h = hidden[s:e]
            grad_logits = ctx.kernel(h @ weight.t(), targets[s:e], lse[s:e], grad[s:e], ctx.temperature)
            if grad_hidden is not None:
                torch.mm(grad_logits, weight, out=grad_hidden[s:e])
            if grad_weight is not None:  # summed over chunks in fp32, not in the head's dtype
                grad_weight += (grad_logits.t() @ h).float()
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, None, None, None, None


def chunk_kernels(compiled: bool) -> tuple[Callable, Callable]:
    """The chunk functions; compiled, each is one fused kernel over a chunk's logits (shapes vary: dynamic)."""
    if not compiled:
        return _forward_chunk, _backward_chunk
    return torch.compile(_forward_chunk, dynamic=True), torch.compile(_backward_chunk, dynamic=True)
