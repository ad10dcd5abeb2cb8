"""``HFEngine``: a transformers model behind the ``Engine`` protocol (the embedded default, CPU or GPU).

Concurrent ``generate`` calls are collected for a short window and decoded together as one left-padded batch with a
KV cache. Every row keeps its own sampling parameters (temperature, top-p, top-k, max/min tokens, stop tokens, seed).
The log-prob returned for each token is ``log_softmax(logits / temperature)`` at that token, before top-k/top-p
filtering: the quantity the trainer recomputes. Temperature 0 means greedy, with log-probs at temperature 1.
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


@dataclass
class _Request:
    prompt_ids: list[int]
    params: SamplingParams
    future: asyncio.Future


class HFEngine:
    def __init__(self, model: Any, tokenizer: Any, *, max_batch_size: int = 64, batch_window_s: float = 0.005) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.batch_window_s = batch_window_s
        self.eos_token_ids = _eos_ids(model, tokenizer)
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_token_ids[0]
        self.max_positions = getattr(model.config, "max_position_embeddings", None)
        # transformers 5.x names the KV cache argument `cache`; 4.x called it `past_key_values`
        self._cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        self._weights_lock = threading.Lock()  # a weight update never interleaves with a decode batch
        self._queue: asyncio.Queue[_Request] | None = None
        self._worker: asyncio.Task | None = None
        self.stats = {"batches": 0, "requests": 0, "generated_tokens": 0}
        self.last_sync = {"wait_s": 0.0, "copy_s": 0.0, "bytes": 0}

    @classmethod
    def from_pretrained(cls, path: str, *, device: str = "cpu", dtype: torch.dtype = torch.float32, **kwargs: Any) -> HFEngine:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)
        return cls(model, AutoTokenizer.from_pretrained(path), **kwargs)

    # -- Engine protocol --
    async def generate(self, prompt_ids: list[int], params: SamplingParams, images: list[Any] | None = None) -> Generation:
        if not prompt_ids:
            raise ValueError("prompt_ids is empty; an engine needs at least one token to condition on")
        if self.max_positions and len(prompt_ids) + params.max_tokens > self.max_positions:
            raise ValueError(f"prompt ({len(prompt_ids)} tokens) + max_tokens ({params.max_tokens}) exceeds the "
                             f"model's {self.max_positions} positions; lower max_tokens or data.max_len")
        if self._queue is None or self._worker is None or self._worker.done():
            self._queue = asyncio.Queue()
            self._worker = asyncio.get_running_loop().create_task(self._serve())
        future = asyncio.get_running_loop().create_future()
        await self._queue.put(_Request(list(prompt_ids), params, future))
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
                outputs = await asyncio.to_thread(self._generate_batch, [(r.prompt_ids, r.params) for r in batch])
            except Exception as exc:  # the whole batch failed: every caller gets the error
                for r in batch:
                    if not r.future.done():
                        r.future.set_exception(exc)
                continue
            for r, out in zip(batch, outputs, strict=True):
                if not r.future.done():
                    r.future.set_result(out)

    @torch.no_grad()
    def _generate_batch(self, requests: list[tuple[list[int], SamplingParams]]) -> list[Generation]:
        with self._weights_lock:
            outputs = self._decode(requests)
        self.stats["batches"] += 1
        self.stats["requests"] += len(requests)
        self.stats["generated_tokens"] += sum(len(o.token_ids) for o in outputs)
        return outputs

    def _decode(self, requests: list[tuple[list[int], SamplingParams]]) -> list[Generation]:
        device = next(self.model.parameters()).device
        n = len(requests)
        longest = max(len(p) for p, _ in requests)
        ids = torch.full((n, longest), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((n, longest), dtype=torch.long)
        for i, (prompt, _) in enumerate(requests):
            ids[i, longest - len(prompt):] = torch.tensor(prompt)
            mask[i, longest - len(prompt):] = 1
        ids, mask = ids.to(device), mask.to(device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        params = [p for _, p in requests]
        stops = [set(p.stop_token_ids if p.stop_token_ids is not None else self.eos_token_ids) for p in params]
        generators = [_generator(p.seed, device) for p in params]
        tokens: list[list[int]] = [[] for _ in range(n)]
        logps: list[list[float]] = [[] for _ in range(n)]
        finish = ["length" if p.max_tokens == 0 else "" for p in params]

        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1)
        cache, logits = getattr(out, self._cache_arg), out.logits[:, -1, :].float()
        for step in range(max(p.max_tokens for p in params)):
            next_ids = torch.full((n,), self.pad_token_id, dtype=torch.long)
            for i, p in enumerate(params):
                if finish[i]:
                    continue
                token, logp = _sample(logits[i], p, generators[i], stops[i] if step < p.min_tokens else set())
                tokens[i].append(token)
                logps[i].append(logp)
                next_ids[i] = token
                if token in stops[i] and step >= p.min_tokens:
                    finish[i] = "stop"
                elif len(tokens[i]) >= p.max_tokens:
                    finish[i] = "length"
            if all(finish):
                break
            mask = torch.cat([mask, torch.ones((n, 1), dtype=mask.dtype, device=device)], dim=1)
            positions = positions[:, -1:] + 1
            out = self.model(input_ids=next_ids[:, None].to(device), attention_mask=mask, position_ids=positions,
                             use_cache=True, **{self._cache_arg: cache})
            cache, logits = getattr(out, self._cache_arg), out.logits[:, -1, :].float()
        return [Generation(t, lp, f or "length") for t, lp, f in zip(tokens, logps, finish, strict=True)]


def _sample(logits: torch.Tensor, p: SamplingParams, generator: torch.Generator | None,
            banned: set[int]) -> tuple[int, float]:
    """Pick one token for one row; return it with its log-prob under the temperature-scaled distribution."""
    scaled = logits / p.temperature if p.temperature > 0 else logits
    logprobs = torch.log_softmax(scaled, dim=-1)
    filtered = scaled.clone()
    if banned:  # min_tokens: stop tokens cannot be sampled yet
        filtered[list(banned)] = float("-inf")
    if p.temperature == 0:
        token = int(filtered.argmax())
        return token, float(logprobs[token])
    if p.top_k > 0 and p.top_k < filtered.numel():
        kth = torch.topk(filtered, p.top_k).values[-1]
        filtered[filtered < kth] = float("-inf")
    if p.top_p < 1.0:
        sorted_logits, order = torch.sort(filtered, descending=True)
        cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(-1)
        drop = cumulative - torch.softmax(sorted_logits, dim=-1) > p.top_p  # keep the token that crosses top_p
        filtered[order[drop]] = float("-inf")
    token = int(torch.multinomial(torch.softmax(filtered, dim=-1), 1, generator=generator))
    return token, float(logprobs[token])


def _generator(seed: int | None, device: torch.device) -> torch.Generator | None:
    return torch.Generator(device=device).manual_seed(seed) if seed is not None else None


def _eos_ids(model: Any, tokenizer: Any) -> list[int]:
    ids = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids = ids if isinstance(ids, list) else [ids] if ids is not None else []
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    if not ids:
        raise ValueError("the tokenizer and model define no end-of-sequence token; set tokenizer.eos_token")
    return ids
