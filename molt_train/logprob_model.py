"""``LogProbModel``: a causal LM whose forward returns the per-token log-probs of the next tokens, (N, L-1).

Log-probs are computed in chunks of ``chunk_size`` positions, each recomputed in backward, so the fp32
full-vocabulary logits of the whole batch never exist at once. With ``share_prefixes``, the rows of a group that
share their prompt run that prefix once (a KV cache copied to each row); see the class docstring. A vision model's
rows bring their image tensors (``mm``), consumed by the model with its own positions (M-RoPE for Qwen2-VL-family
models: ``molt_train.models.multimodal.position_ids``).

An MoE policy under ``--train.routing_replay`` / ``--train.record_routing`` has a ``GateReplay`` on its routers
(``replay``, set by the policy worker): each forward of the LM hands it the routing records of exactly the tokens it
runs, the plain forward's rows, or the shared prefixes' and then the rows' suffixes.
"""

from __future__ import annotations

import inspect

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from molt_train import context_parallel
from molt_train.models.multimodal import position_ids
from molt_train.routing import NO_RECORD, GateReplay, input_axis


def _chunk_logp(hidden: Tensor, targets: Tensor, weight: Tensor, temperature: float) -> Tensor:
    logits = (hidden @ weight.t()).float() / temperature
    return logits.gather(-1, targets[:, None])[:, 0] - logits.logsumexp(-1)


def _chunk_logp_candidates(hidden: Tensor, targets: Tensor, weight: Tensor, temperature: float, cand: Tensor) -> Tensor:
    """(chunk, 2 + k): the target's log-prob, ``sum_v sg(p_v) log p_v``, and the log-probs of the ``cand`` ids."""
    logp = ((hidden @ weight.t()).float() / temperature).log_softmax(-1)
    expected = (logp.detach().exp() * logp).sum(-1)
    return torch.cat([logp.gather(-1, targets[:, None]), expected[:, None], logp.gather(-1, cand)], dim=-1)


class LogProbModel(nn.Module):
    """Wraps a causal LM so one forward returns per-token log-probs of the next tokens, (N, L-1).

    With ``share_prefixes``, rows whose tokens before their first action are identical (the samples of a GRPO group
    share their prompt) run that prefix once: one forward over the distinct prefixes with a KV cache, the cache
    copied to each row, one forward over the rows' remaining tokens. The log-probs are those of the plain forward
    (up to float rounding) and the gradients flow through the copies, so the result is the same computation on fewer
    tokens; it is used when it saves at least a fifth of the tokens.
    """

    def __init__(
        self, lm: nn.Module, chunk_size: int, share_prefixes: bool = False, compile_chunks: bool = False
    ) -> None:
        super().__init__()
        self.lm = lm
        self.chunk_size = chunk_size
        self.share_prefixes = share_prefixes
        # compiled, a chunk's upcast, log-sum-exp and gather fuse: its fp32 logits are never written out
        self._chunk_logp = torch.compile(_chunk_logp, dynamic=True) if compile_chunks else _chunk_logp
        self.replay: GateReplay | None = None
        self.cp_group: object | None = (
            None  # --fsdp.cp_size > 1: the context-parallel group (molt_train.context_parallel)
        )
        # transformers 5.x names the KV cache argument `cache`; 4.x called it `past_key_values`
        self._cache_arg = "cache" if "cache" in inspect.signature(lm.model.forward).parameters else "past_key_values"

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        temperature: float = 1.0,
        action_mask: Tensor | None = None,
        mm: dict[str, Tensor] | None = None,
        candidates: Tensor | None = None,
        routing: Tensor | None = None,
    ) -> Tensor:
        """``action_mask`` (N, L-1): where the actions start, for prefix sharing (None: a plain forward). ``mm``: the
        rows' image tensors, concatenated in row order (a vision model's rows; no prefix sharing then).
        ``candidates`` (N, L-1, k) token ids (score centering): the result is then (N, L-1, 2 + k), the target's
        log-prob, ``sum_v sg(p_v) log p_v`` and the candidates' log-probs at each position (a plain forward).
        ``routing`` (N, L-1, layers, k): the rows' recorded experts (``molt_train.routing``), for ``replay``."""
        if self.replay is None:
            routing = None
        else:  # the plain forward's records; the shared one sets its own per call
            routing = None if routing is None else input_axis(routing)
            self.replay.set(routing)
        if self.share_prefixes and action_mask is not None and not mm and candidates is None:
            lengths = attention_mask.sum(1)
            first_action = torch.where(action_mask.any(1), action_mask.int().argmax(1) + 1, lengths)
            prefix_lens = torch.minimum(first_action, lengths).clamp(min=1)
            rows = [tuple(ids[:p]) for ids, p in zip(input_ids.tolist(), prefix_lens.tolist(), strict=True)]
            first: dict[tuple[int, ...], int] = {}  # distinct prefix -> its first row
            owner = [first.setdefault(r, i) for i, r in enumerate(rows)]
            suffix = int((lengths - prefix_lens).max())
            shared_tokens = len(first) * int(prefix_lens.max()) + len(rows) * suffix
            if shared_tokens <= 0.8 * input_ids.numel():
                device = input_ids.device
                distinct = list(first.values())
                slot = {row: k for k, row in enumerate(distinct)}
                return self._shared_forward(
                    input_ids,
                    temperature,
                    lengths,
                    prefix_lens,
                    torch.tensor(distinct, device=device),
                    torch.tensor([slot[o] for o in owner], device=device),
                    suffix,
                    routing,
                )
        mm = mm or {}
        if self.cp_group is not None:
            if mm or candidates is not None or routing is not None:
                raise ValueError(
                    "--fsdp.cp_size > 1 runs text rows only: image tensors, score-centering candidates and routing "
                    "replay are not split by sequence here; use --fsdp.cp_size 1"
                )
            positions = position_ids(self.lm, input_ids, attention_mask, mm)
            return context_parallel.logprobs(
                self.lm.model, self._logp, input_ids, attention_mask, positions, temperature, self.cp_group
            ).clone()
        hidden = self.lm.model(
            input_ids=input_ids,
            attention_mask=attention_mask,  # [0]: a ModelOutput or a
            position_ids=position_ids(self.lm, input_ids, attention_mask, mm),
            use_cache=False,
            **mm,
        )[0][:, :-1]  # tuple (AutoModel's)
        if candidates is not None:
            return self._logp(hidden, input_ids[:, 1:], temperature, candidates).clone()
        return self._logp(hidden, input_ids[:, 1:], temperature).clone()  # FSDP2 warns on view outputs

    def _shared_forward(
        self,
        input_ids: Tensor,
        temperature: float,
        lengths: Tensor,
        prefix_lens: Tensor,
        first: Tensor,
        owner: Tensor,
        suffix: int,
        routing: Tensor | None = None,
    ) -> Tensor:
        """``first``: a row of each distinct prefix; ``owner``: each row's prefix (an index into ``first``);
        ``suffix``: the longest row's tokens after its prefix; ``routing``: the rows' records on the input axis."""
        n, length = input_ids.shape
        device = input_ids.device
        p = prefix_lens[first]
        width = int(p.max())
        steps = torch.arange(width, device=device)
        prefix_mask = (steps < p[:, None]).long()  # right-padded: no query row is fully masked
        if routing is not None:  # a prefix's tokens past its end are another row's, seen through the mask: live
            self.replay.set(torch.where(prefix_mask[..., None, None].bool(), routing[first, :width], NO_RECORD))
        prefix = self.lm.model(
            input_ids=input_ids[first, :width],
            attention_mask=prefix_mask,
            position_ids=steps.expand(len(first), width),
            use_cache=True,
        )
        prefix_hidden = prefix.last_hidden_state
        pieces = [self._logp(prefix_hidden[:, :-1], input_ids[first, 1:width], temperature).reshape(-1)]
        p_row = prefix_lens[:, None]
        t = torch.arange(length - 1, device=device)[None, :]
        index = torch.where(t < p_row - 1, owner[:, None] * (width - 1) + t, -1)
        if suffix > 0:
            cols = p_row + torch.arange(suffix, device=device)[None, :]
            suffix_ids = input_ids.gather(1, cols.clamp(max=length - 1))
            if routing is not None:
                rows = torch.arange(n, device=device)[:, None]
                real = (cols < lengths[:, None])[..., None, None]
                self.replay.set(torch.where(real, routing[rows, cols.clamp(max=length - 1)], NO_RECORD))
            cache = getattr(prefix, self._cache_arg)
            cache.reorder_cache(owner)
            mask = torch.cat([prefix_mask[owner], (cols < lengths[:, None]).long()], dim=1)
            rest = self.lm.model(
                input_ids=suffix_ids, attention_mask=mask, position_ids=cols, use_cache=True, **{self._cache_arg: cache}
            ).last_hidden_state
            last = prefix_hidden[owner, prefix_lens - 1][:, None]  # predicts each row's first suffix token
            pieces.append(self._logp(torch.cat([last, rest[:, :-1]], dim=1), suffix_ids, temperature).reshape(-1))
            offset = t - p_row + 1
            in_suffix = (offset >= 0) & (offset < suffix)
            index = torch.where(
                in_suffix, len(first) * (width - 1) + torch.arange(n, device=device)[:, None] * suffix + offset, index
            )
        pieces.append(torch.zeros(1, device=device))  # positions past a row's end (padding): 0
        flat = torch.cat(pieces)
        return flat[torch.where(index < 0, flat.numel() - 1, index)]

    def _logp(self, hidden: Tensor, targets: Tensor, temperature: float, candidates: Tensor | None = None) -> Tensor:
        """Log-probs of ``targets`` (N, T) from ``hidden`` (N, T, H), in chunks of ``chunk_size`` positions
        (with ``candidates`` (N, T, k): (N, T, 2 + k), see ``forward``)."""
        n, length, width = hidden.shape
        flat, targets = hidden.reshape(-1, width), targets.reshape(-1)
        weight = self.lm.lm_head.weight
        fn, extra, shape = self._chunk_logp, (), (n, length)
        if candidates is not None:
            k = candidates.shape[-1]
            fn, cand, shape = _chunk_logp_candidates, candidates.reshape(-1, k), (n, length, 2 + k)
        chunks = []
        for s in range(0, flat.shape[0], self.chunk_size):
            if candidates is not None:
                extra = (cand[s : s + self.chunk_size],)
            args = (flat[s : s + self.chunk_size], targets[s : s + self.chunk_size], weight, temperature, *extra)
            chunks.append(checkpoint(fn, *args, use_reentrant=False) if torch.is_grad_enabled() else fn(*args))
        return torch.cat(chunks).reshape(shape) if chunks else hidden.new_zeros(shape)
