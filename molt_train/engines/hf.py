"""``HFEngine``: a transformers model behind the ``Engine`` protocol (the embedded default, CPU or GPU).

Concurrent ``generate`` calls are collected for a short window and decoded together as one left-padded batch with a
KV cache: each distinct prompt is prefilled once, then one forward per decode step serves every row, and every row
is sampled at once from per-row parameter tensors (temperature, top-p, top-k, max/min tokens, stop tokens, seed;
inverse-CDF sampling on one uniform per row and step, drawn from ``torch.Generator(seed)`` when the row has a seed).
The log-prob returned for each token is ``log_softmax(logits / temperature)`` at that token, before top-k/top-p
filtering: the quantity the trainer recomputes. Temperature 0 means greedy, with log-probs at temperature 1.

A vision model's requests carry ``VisionInputs`` (the processor's image tensors, aligned with the image placeholders
in the prompt ids): the prefill forward consumes them, concatenated in row order, and the positions are the
model's own (M-RoPE for Qwen2-VL-family models, ``molt_train.models.multimodal``); decode steps read the KV cache.

With ``top_logprobs=k`` (score centering) the engine also records each generated token's top-k candidates and
their log-probs, in ``Generation.extra["top_logprobs"]`` and in ``top_table``, keyed by (prompt ids, generated ids),
where the rollout worker finds them for the trajectories a runner assembled (``pop_top_logprobs``).

With ``record_routing`` (an MoE model; ``molt_train.routing``) forward hooks on the routers record the experts of
every position each row forwarded: its prompt's real positions in the prefill (the left padding dropped; rows
sharing a prompt share its prefill's), then each generated token in the decode step that fed it. The record,
``(len(prompt) + len(generated) - 1, moe_layers, k)`` int16, is kept in ``routing_table`` under the same key
(``routing_record``).
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from molt_envs import Generation, SamplingParams
from molt_envs.vision import VisionInputs, text_tokenizer
from molt_train.models.multimodal import is_vision_config, load_model, load_processor, position_ids, select_rows


@dataclass
class _Request:
    prompt_ids: list[int]
    params: SamplingParams
    future: asyncio.Future
    mm: VisionInputs | None = None


class HFEngine:
    """``tokenizer``: the model's tokenizer, or a vision model's processor (``processor`` keeps what was given, which
    is what runners take; ``tokenizer`` is always the text tokenizer)."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_batch_size: int = 64,
        batch_window_s: float = 0.005,
        top_logprobs: int = 0,
        record_routing: bool = False,
    ) -> None:
        self.model = model.eval()
        self.processor = tokenizer
        tokenizer = self.tokenizer = text_tokenizer(tokenizer)
        self.reads_images = is_vision_config(model.config)
        if top_logprobs > len(tokenizer):
            raise ValueError(
                f"top_logprobs {top_logprobs} exceeds the vocabulary ({len(tokenizer)} tokens); lower "
                "--algo.advantage.score_centering_top_k"
            )
        self.top_logprobs = top_logprobs
        self.top_table: dict[tuple[tuple[int, ...], tuple[int, ...]], tuple[torch.Tensor, torch.Tensor]] = {}
        self.routing_table: dict[tuple[tuple[int, ...], tuple[int, ...]], torch.Tensor] = {}
        self._routed: list[torch.Tensor] | None = None  # recording: each router's choices in the forward just run
        if record_routing:
            from molt_train.routing import router_modules

            self._routed = []
            for router in router_modules(model, "--train.routing_replay / --train.record_routing"):
                router.register_forward_hook(lambda _module, _args, out: self._routed.append(out[2]))
        self.max_batch_size = max_batch_size
        self.batch_window_s = batch_window_s
        self.eos_token_ids = _eos_ids(model, tokenizer)
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_token_ids[0]
        text_config = getattr(model.config, "text_config", None) or model.config
        self.max_positions = getattr(text_config, "max_position_embeddings", None)
        # transformers 5.x names the KV cache argument `cache`; 4.x called it `past_key_values`
        self._cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        self._weights_lock = threading.Lock()  # a weight update never interleaves with a decode batch
        self._queue: asyncio.Queue[_Request] | None = None
        self._worker: asyncio.Task | None = None
        self.stats = {"batches": 0, "requests": 0, "generated_tokens": 0}
        self.last_sync = {"wait_s": 0.0, "copy_s": 0.0, "bytes": 0}

    @classmethod
    def from_pretrained(
        cls, path: str, *, device: str = "cpu", dtype: torch.dtype = torch.float32, **kwargs: Any
    ) -> HFEngine:
        model = load_model(path, dtype=dtype).to(device)
        return cls(model, load_processor(path), **kwargs)

    # -- Engine protocol --
    async def generate(
        self, prompt_ids: list[int], params: SamplingParams, mm_inputs: VisionInputs | None = None
    ) -> Generation:
        if not prompt_ids:
            raise ValueError("prompt_ids is empty; an engine needs at least one token to condition on")
        if mm_inputs is not None and not isinstance(mm_inputs, VisionInputs):
            raise TypeError(f"mm_inputs must be molt_envs.vision.VisionInputs, got {type(mm_inputs).__name__}")
        if mm_inputs and not self.reads_images:
            raise ValueError(
                f"{len(mm_inputs)} image(s) sent to a text-only model ({type(self.model).__name__}); "
                "use a vision-language checkpoint"
            )
        if self.max_positions and len(prompt_ids) + params.max_tokens > self.max_positions:
            raise ValueError(
                f"prompt ({len(prompt_ids)} tokens) + max_tokens ({params.max_tokens}) exceeds the "
                f"model's {self.max_positions} positions; lower max_tokens or data.max_len"
            )
        if self._queue is None or self._worker is None or self._worker.done():
            self._queue = asyncio.Queue()
            self._worker = asyncio.get_running_loop().create_task(self._serve())
        future = asyncio.get_running_loop().create_future()
        await self._queue.put(_Request(list(prompt_ids), params, future, mm_inputs or None))
        return await future

    # -- weights --
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Copy tensors into the model in place; returns the number of bytes moved.

        ``last_sync`` records the two halves of the time: ``wait_s`` waiting for the decode batch in flight to
        finish (the engine's weight lock), ``copy_s`` moving the bytes in.
        """
        params = dict(self.model.named_parameters())
        params.update(dict(self.model.named_buffers()))
        moved = 0
        start = time.perf_counter()
        with self._weights_lock, torch.no_grad():
            locked = time.perf_counter()
            for name, tensor in named_tensors:
                if name not in params:
                    raise KeyError(f"weight {name!r} does not exist in the engine's model")
                params[name].copy_(tensor.to(params[name].device, params[name].dtype))
                moved += tensor.numel() * tensor.element_size()
        self.last_sync = {"wait_s": locked - start, "copy_s": time.perf_counter() - locked, "bytes": moved}
        return moved

    # -- batching --
    async def _serve(self) -> None:
        queue = self._queue
        while True:
            batch = [await queue.get()]
            # what is queued already is taken first, without a clock: a batch's rows (and so its padding and float
            # rounding) then do not depend on how fast this loop runs, e.g. when all the episodes of a rollout step
            # queued their first turn at once; the window only waits for requests that have not arrived yet
            while len(batch) < self.max_batch_size and not queue.empty():
                batch.append(queue.get_nowait())
            deadline = time.monotonic() + self.batch_window_s
            while len(batch) < self.max_batch_size:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                try:
                    batch.append(await asyncio.wait_for(queue.get(), remaining))
                except TimeoutError:
                    break
            try:
                outputs = await asyncio.to_thread(self._generate_batch, [(r.prompt_ids, r.params, r.mm) for r in batch])
            except Exception as exc:  # the whole batch failed: every caller gets the error
                for r in batch:
                    if not r.future.done():
                        r.future.set_exception(exc)
                continue
            for r, out in zip(batch, outputs, strict=True):
                if not r.future.done():
                    r.future.set_result(out)

    @torch.no_grad()
    def _generate_batch(
        self, requests: list[tuple[list[int], SamplingParams, VisionInputs | None]]
    ) -> list[Generation]:
        with self._weights_lock:
            outputs = self._decode(requests)
        self.stats["batches"] += 1
        self.stats["requests"] += len(requests)
        self.stats["generated_tokens"] += sum(len(o.token_ids) for o in outputs)
        return outputs

    def _decode(self, requests: list[tuple[list[int], SamplingParams, VisionInputs | None]]) -> list[Generation]:
        """One batched forward per decode step for every row; each distinct prompt (ids and images) is prefilled
        once (a GRPO group's samples share it) and its KV cache is copied to the rows that asked for it."""
        device = next(self.model.parameters()).device
        n = len(requests)
        params = [p for _, p, _ in requests]
        distinct: dict[tuple[Any, ...], int] = {}
        first: list[tuple[list[int], VisionInputs | None]] = []
        rows = []
        for prompt, _, mm in requests:  # the inputs of one batch are alive together: id() tells them apart
            key = (tuple(prompt), id(mm) if mm else None)
            if key not in distinct:
                distinct[key] = len(first)
                first.append((prompt, mm))
            rows.append(distinct[key])
        row_prompt = torch.tensor(rows, device=device)
        longest = max(len(p) for p, _ in first)
        ids = torch.full((len(first), longest), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(first), longest), dtype=torch.long)
        for i, (prompt, _) in enumerate(first):
            ids[i, longest - len(prompt) :] = torch.tensor(prompt)
            mask[i, longest - len(prompt) :] = 1
        ids, mask = ids.to(device), mask.to(device)
        images = sum((mm for _, mm in first if mm), VisionInputs())  # in row order: the order the forward reads them
        tensors = {k: v.to(device) for k, v in images.tensors.items()}
        positions = position_ids(self.model, ids, mask, tensors)
        if self._routed is not None:
            self._routed.clear()  # what a failed batch's forward left
        out = self.model(
            input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1, **tensors
        )
        cache, logits = getattr(out, self._cache_arg), out.logits[:, -1, :].float()
        prefill_routes, step_routes = self._take_routes(len(first), longest), []
        if len(first) < n:  # rows sharing a prompt share its prefill
            cache.reorder_cache(row_prompt)
            logits, mask, positions = logits[row_prompt], mask[row_prompt], select_rows(positions, row_prompt)

        steps = max(p.max_tokens for p in params)
        prompt_of = rows
        rows = _RowParams(params, steps, device)
        stops = [set(p.stop_token_ids if p.stop_token_ids is not None else self.eos_token_ids) for p in params]
        tokens: list[list[int]] = [[] for _ in range(n)]
        logps: list[list[float]] = [[] for _ in range(n)]
        tops: list[tuple[torch.Tensor, torch.Tensor]] = []  # per step: (n, k) log-probs, ids
        finish = ["length" if p.max_tokens == 0 else "" for p in params]
        for step in range(steps):
            banned = [(i, stops[i]) for i, p in enumerate(params) if step < p.min_tokens and not finish[i]]
            chosen, chosen_logp = rows.sample(logits, step, banned)
            if self.top_logprobs:
                tops.append(torch.log_softmax(logits / rows.scale, dim=-1).topk(self.top_logprobs, dim=-1))
            next_ids = torch.where(torch.tensor([not f for f in finish], device=device), chosen, self.pad_token_id)
            for i, (token, logp) in enumerate(zip(chosen.tolist(), chosen_logp.tolist(), strict=True)):
                if finish[i]:
                    continue
                tokens[i].append(token)
                logps[i].append(logp)
                if token in stops[i] and step >= params[i].min_tokens:
                    finish[i] = "stop"
                elif len(tokens[i]) >= params[i].max_tokens:
                    finish[i] = "length"
            if all(finish):
                break
            mask = torch.cat([mask, torch.ones((n, 1), dtype=mask.dtype, device=device)], dim=1)
            positions = positions[..., -1:] + 1
            out = self.model(
                input_ids=next_ids[:, None],
                attention_mask=mask,
                position_ids=positions,
                use_cache=True,
                **{self._cache_arg: cache},
            )
            cache, logits = getattr(out, self._cache_arg), out.logits[:, -1, :].float()
            step_routes.append(self._take_routes(n, 1))
        outputs = [Generation(t, lp, f or "length") for t, lp, f in zip(tokens, logps, finish, strict=True)]
        if self.top_logprobs:
            values = torch.stack([v for v, _ in tops], 1).cpu()  # (n, steps, k)
            ids = torch.stack([i for _, i in tops], 1).cpu()
            for i, out in enumerate(outputs):
                top = (ids[i, : len(out.token_ids)], values[i, : len(out.token_ids)])
                out.extra["top_logprobs"] = top
                self.top_table[(tuple(requests[i][0]), tuple(out.token_ids))] = top
        if prefill_routes is not None:
            prefill_routes = prefill_routes.cpu()
            empty = prefill_routes.new_empty((n, 0, *prefill_routes.shape[2:]))
            decoded = torch.cat(step_routes, 1).cpu() if step_routes else empty
            for i, out in enumerate(outputs):
                prompt = requests[i][0]
                record = torch.cat([prefill_routes[prompt_of[i], longest - len(prompt) :], decoded[i]])
                positions = len(prompt) + len(out.token_ids) - 1  # the last token predicts nothing
                self.routing_table[(tuple(prompt), tuple(out.token_ids))] = record[:positions]
        return outputs

    def _take_routes(self, rows: int, positions: int) -> torch.Tensor | None:
        """Recording: the experts each router chose in the forward just run, (rows, positions, layers, k) int16;
        None when not recording."""
        if self._routed is None:
            return None
        routes = torch.stack(self._routed, dim=1)  # the routers see the (rows * positions) tokens flattened
        self._routed.clear()
        return routes.view(rows, positions, *routes.shape[1:]).to(torch.int16)

    def routing_record(self, prompt_ids: list[int], token_ids: list[int]) -> torch.Tensor | None:
        """The routing recorded when ``token_ids`` were generated after ``prompt_ids`` (``record_routing``), None if
        this engine generated no such continuation."""
        return self.routing_table.get((tuple(prompt_ids), tuple(token_ids)))

    def pop_top_logprobs(self, prompt_ids: list[int], token_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The (ids, log-probs), each (len(token_ids), k), recorded when ``token_ids`` were generated after
        ``prompt_ids``; None if this engine generated no such continuation."""
        return self.top_table.pop((tuple(prompt_ids), tuple(token_ids)), None)


class _RowParams:
    """The sampling parameters of a decode batch as per-row tensors, and the rows' random draws: one uniform per
    row and step, from ``torch.Generator(seed)`` for a row with a seed (so its samples do not depend on the batch
    it lands in), from torch's global generator otherwise."""

    def __init__(self, params: list[SamplingParams], steps: int, device: torch.device) -> None:
        self.temperature = torch.tensor([p.temperature for p in params], device=device)
        self.greedy = self.temperature == 0
        self.any_greedy, self.all_greedy = bool(self.greedy.any()), bool(self.greedy.all())
        self.scale = torch.where(self.greedy, 1.0, self.temperature)[:, None]
        self.top_k = torch.tensor([p.top_k if p.top_k > 0 else 0 for p in params], device=device)
        self.top_p = torch.tensor([p.top_p for p in params], device=device)
        self.any_top_k, self.any_top_p = bool((self.top_k > 0).any()), bool((self.top_p < 1).any())
        uniforms = torch.empty((len(params), max(steps, 1)))
        for i, p in enumerate(params):
            if p.seed is not None:
                uniforms[i] = torch.rand(uniforms.shape[1], generator=torch.Generator().manual_seed(p.seed))
        unseeded = [i for i, p in enumerate(params) if p.seed is None]
        if unseeded:
            uniforms[unseeded] = torch.rand((len(unseeded), uniforms.shape[1]))
        self.uniforms = uniforms.to(device)

    def sample(
        self, logits: torch.Tensor, step: int, banned: list[tuple[int, set[int]]]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's next token, and its log-prob under the temperature-scaled distribution (before top-k/top-p
        and min_tokens filtering; temperature 0: greedy, at temperature 1). ``banned``: (row, stop tokens) pairs
        that cannot be sampled yet (min_tokens)."""
        scaled = logits / self.scale
        logprobs = torch.log_softmax(scaled, dim=-1)
        filtered = scaled.clone() if banned or self.any_top_k or self.any_top_p else scaled
        for row, stop in banned:
            filtered[row, list(stop)] = float("-inf")
        vocab = filtered.shape[-1]
        if self.any_top_k or self.any_top_p:
            sorted_logits, order = torch.sort(filtered, dim=-1, descending=True)
            if self.any_top_k:
                kth = sorted_logits.gather(-1, (self.top_k.clamp(1, vocab) - 1)[:, None])
                cut = (self.top_k[:, None] > 0) & (self.top_k[:, None] < vocab) & (filtered < kth)
                filtered = filtered.masked_fill(cut, float("-inf"))
                sorted_logits = sorted_logits.masked_fill(cut.gather(-1, order), float("-inf"))
            if self.any_top_p:
                probs = torch.softmax(sorted_logits, dim=-1)
                drop = probs.cumsum(-1) - probs > self.top_p[:, None]  # keep the token that crosses top_p
                filtered = filtered.masked_fill(torch.zeros_like(drop).scatter(-1, order, drop), float("-inf"))
        if self.all_greedy:
            chosen = filtered.argmax(-1)
        else:
            probs = torch.softmax(filtered, dim=-1)
            cdf = probs.cumsum(-1)
            draw = (self.uniforms[:, step] * cdf[:, -1])[:, None]
            chosen = torch.searchsorted(cdf, draw, right=True)[:, 0].clamp(max=vocab - 1)
            rounding = probs.gather(-1, chosen[:, None])[:, 0] == 0  # a draw past the last cdf step
            chosen = torch.where(rounding, probs.argmax(-1), chosen)
            if self.any_greedy:
                chosen = torch.where(self.greedy, filtered.argmax(-1), chosen)
        return chosen, logprobs.gather(-1, chosen[:, None])[:, 0]


def _eos_ids(model: Any, tokenizer: Any) -> list[int]:
    ids = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids = ids if isinstance(ids, list) else [ids] if ids is not None else []
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    if not ids:
        raise ValueError("the tokenizer and model define no end-of-sequence token; set tokenizer.eos_token")
    return ids
