"""``VLLMEngine``: vLLM's async engine (v1 ``AsyncLLM``) behind the ``Engine`` protocol, for GPU rollouts.

- Token ids in and out (no detokenisation); for every generated token the log-prob of that token under the
  distribution it was sampled from, after temperature (vLLM ``logprobs_mode="processed_logprobs"``): with top_p 1
  and top_k off (what IS correction requires) this is ``log_softmax(logits / T)``, the trainer's recompute; with
  top-k/top-p on it is the renormalised truncated distribution.
- The full sampling set is pinned on every request (temperature, top-p, top-k, min-p 0, penalties off, min/max
  tokens, explicit stop ids with ``ignore_eos``, seed), so nothing comes from the checkpoint's generation config.
- Weight sync without disk: tensors are packed into buckets (``weight_buckets``) and loaded through vLLM's own
  ``model.load_weights`` in the engine's worker (``vllm_worker.WeightSyncExtension``), one RPC per bucket: CUDA
  IPC when trainer and engine share the GPU, an NCCL broadcast from trainer rank 0 (``NcclWeightSender``) when
  they do not. ``last_sync`` splits the time into ``wait_s`` (getting the engine to a safe point: pausing it
  when requests are in flight) and ``copy_s`` (moving and loading the bytes).
- ``check_weight_update_equal`` names every vLLM parameter whose synced value differs from the trainer's.
- Partial rollout: a sync while requests are in flight pauses the engine (``mode="keep"``), loads, and resumes;
  those requests continue on the new weights (``Generation.extra["weight_versions"]`` tells the trainer which
  requests straddled a sync). Sleep/wake (``--vllm.enable_sleep``) frees the engine's memory for training.
- One engine over several GPUs: ``--vllm.tensor_parallel_size`` x ``--vllm.data_parallel_size`` worker processes
  (vLLM's ``mp`` executor; DP replicas are engine-core processes of their own), ``--vllm.enable_expert_parallel``
  for MoE. Every RPC reaches every worker of every replica (``_rpc``), so every TP shard loads every bucket through
  its own ``load_weights`` (each takes its slice): by CUDA IPC from the trainer rank on its own GPU (colocated; a
  bucket of another visible GPU when none is), or from trainer rank 0's NCCL broadcast to 1 + TP x DP ranks.
- ``--vllm.num_engines N`` on one GPU: N vLLM engine processes share it, each with 1/N of
  ``gpu_memory_utilization``; a request goes to the engine with the fewest in flight, and every sync, pause, check
  and sleep reaches all of them. vLLM's per-request host work (scheduling, inputs, outputs) bounds a small model's
  decode step; N processes do that work in parallel (``benchmarks/README.md``, 256 sequences of a 0.6B model:
  1.07-1.4x with 2 engines, slower with 4, where GPU time-slicing between the processes costs more).

- Images: a vision model's request carries ``VisionInputs``; vLLM expands image placeholders itself, so each
  image's run of placeholders is folded back to one placeholder and the images go as ``multi_modal_data`` (vLLM's
  processor is the checkpoint's own, the one the runner used). vLLM's expanded prompt must equal the trajectory's
  ids: a mismatch is an error naming it, never silently different tokens. ``limit_mm_per_prompt`` is
  ``molt_envs.vision.MAX_IMAGES`` images (no video) for a vision checkpoint.

- MoE routing (``record_routing``; ``molt_train.routing``): the engine runs with ``enable_return_routed_experts``
  and keeps each request's experts, one record of ``len(prompt) + len(generated) - 1`` positions (``vllm_routing``),
  in ``routing_table`` under (prompt ids, generated ids), the key the rollout worker asks ``routing_record`` with.

vLLM is optional: importing this module never imports it (only starting an engine does).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import pickle
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from molt_envs import Generation, SamplingParams
from molt_envs.vision import MAX_IMAGES, VisionInputs
from molt_train.config.engine import BUCKET_BYTES, VLLM_INSTALL_HINT, VLLMConfig
from molt_train.engines.weight_buckets import pack, plan_buckets, share

WORKER_EXTENSION = "molt_train.engines.vllm_worker.WeightSyncExtension"


def engine_kwargs(options: VLLMConfig, model: str, seed: int = 0) -> dict[str, Any]:
    """Keyword arguments of ``vllm.AsyncEngineArgs`` from the ``--vllm.*`` flags, for each of the
    ``options.num_engines`` engines; ``seed``: the run's (``--train.seed``)."""
    kwargs: dict[str, Any] = {
        "model": model,
        "dtype": options.dtype,
        "tensor_parallel_size": options.tensor_parallel_size,
        "data_parallel_size": options.data_parallel_size,
        "gpu_memory_utilization": options.gpu_memory_utilization / options.num_engines,  # each engine's share
        "enforce_eager": options.enforce_eager,
        "enable_prefix_caching": options.enable_prefix_caching,
        "enable_sleep_mode": options.enable_sleep,
        "seed": seed,
        "logprobs_mode": "processed_logprobs",
        "generation_config": "vllm",  # never take sampling defaults from the checkpoint
        "worker_extension_cls": WORKER_EXTENSION,
        "disable_log_stats": True,
    }
    if options.enable_expert_parallel:
        kwargs["enable_expert_parallel"] = True
    if options.tensor_parallel_size > 1:
        # the engine's own worker processes on the GPUs this actor sees; inside a Ray placement group vLLM would
        # otherwise pick its Ray executor and ask the group for bundles of its own
        kwargs["distributed_executor_backend"] = "mp"
    for name in ("max_num_batched_tokens", "max_num_seqs", "max_model_len"):
        if getattr(options, name) is not None:
            kwargs[name] = getattr(options, name)
    compilation: dict[str, Any] = {}
    if not options.compile and not options.enforce_eager:
        # vLLM's Dynamo + Inductor compile and its piecewise graphs take most of a cold start; full CUDA graphs need
        # neither (FlashAttention 3 replays whole decode steps), and decode is where a rollout spends its time
        compilation = {"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY"}
    if options.max_num_seqs and options.max_num_seqs > 512 and not options.enforce_eager:
        # vLLM captures CUDA graphs up to 512 sequences by default; a fuller decode batch would run without one
        compilation["max_cudagraph_capture_size"] = options.max_num_seqs
    if compilation:
        kwargs["compilation_config"] = compilation
    if options.moe_backend is not None:
        kwargs["moe_backend"] = options.moe_backend
    if options.mtp_num_speculative_tokens:
        kwargs["speculative_config"] = {"method": "mtp", "num_speculative_tokens": options.mtp_num_speculative_tokens}
    return kwargs


LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)  # the max_lora_rank values vLLM accepts


def lora_kwargs(lora_rank: int) -> dict[str, Any]:
    """``vllm.AsyncEngineArgs`` that let the engine serve one LoRA adapter of rank ``lora_rank`` (0: none)."""
    if not lora_rank:
        return {}
    fitting = [r for r in LORA_RANKS if r >= lora_rank]
    if not fitting:
        raise ValueError(f"--model.lora_dim {lora_rank} exceeds the largest LoRA rank vLLM serves ({LORA_RANKS[-1]})")
    return {"enable_lora": True, "max_lora_rank": fitting[0], "max_loras": 1}


def sampling_kwargs(params: SamplingParams, default_stop_ids: Sequence[int]) -> dict[str, Any]:
    """Every field of the vLLM ``SamplingParams`` a request carries (the whole set, pinned)."""
    stop = params.stop_token_ids if params.stop_token_ids is not None else default_stop_ids
    return {
        "n": 1,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k if params.top_k > 0 else 0,  # vLLM: 0 = off
        "min_p": 0.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "repetition_penalty": 1.0,
        "max_tokens": params.max_tokens,
        "min_tokens": params.min_tokens,
        "seed": params.seed,
        "stop_token_ids": list(stop),
        "ignore_eos": True,  # stop exactly on stop_token_ids, never on an eos id vLLM reads from the checkpoint
        "logprobs": 0,  # the sampled token's log-prob only
        "flat_logprobs": True,
        "detokenize": False,
        "skip_special_tokens": False,
    }


def sampled_logprobs(logprobs: Any, token_ids: Sequence[int]) -> list[float]:
    """The log-prob of each sampled token from vLLM's per-position logprobs (flat or list of dicts)."""
    if logprobs is None or len(logprobs) != len(token_ids):
        got = "none" if logprobs is None else len(logprobs)
        raise RuntimeError(
            f"vLLM returned {got} log-prob positions for {len(token_ids)} tokens; "
            "the engine must run with logprobs=0 on every request"
        )
    if hasattr(logprobs, "start_indices"):  # FlatLogprobs
        out = []
        for i, token in enumerate(token_ids):
            for j in range(logprobs.start_indices[i], logprobs.end_indices[i]):
                if logprobs.token_ids[j] == token:
                    out.append(float(logprobs.logprobs[j]))
                    break
            else:
                raise RuntimeError(f"vLLM returned no log-prob for sampled token {token} at position {i}")
        return out
    return [float(position[token].logprob) for position, token in zip(logprobs, token_ids, strict=True)]


def vllm_routing(output: Any, prompt_len: int, generated: int) -> torch.Tensor:
    """A finished request's experts as one record, ``(prompt_len + generated - 1, layers, k)`` int16 (the last
    generated token is never forwarded). vLLM builds differ: the completion's ``routed_experts`` covers the whole
    sequence, or only the generated tokens with the prompt's on the request (``prompt_routed_experts``). Positions
    vLLM returned nothing for are ``NO_RECORD`` (they route live in the trainer)."""
    from molt_train.routing import NO_RECORD

    routed = output.outputs[0].routed_experts
    if routed is None:
        raise RuntimeError(
            "vLLM returned no routed_experts although the engine runs with enable_return_routed_experts: this "
            "build does not capture this model's MoE routing; drop --train.routing_replay / --train.record_routing"
        )
    rows = torch.as_tensor(routed).to(torch.int16)
    prompt = getattr(output, "prompt_routed_experts", None)
    if prompt is not None and rows.shape[0] <= generated:  # the generated tokens' only
        rows = torch.cat([torch.as_tensor(prompt).to(torch.int16), rows])
    positions = prompt_len + generated - 1
    record = torch.full((positions, *rows.shape[1:]), NO_RECORD, dtype=torch.int16)
    record[: min(positions, rows.shape[0])] = rows[:positions]
    return record


def eos_token_ids(model_path: str, tokenizer: Any) -> list[int]:
    """End-of-sequence ids: the generation config's, the model config's and the tokenizer's."""
    from transformers import AutoConfig, GenerationConfig

    ids: list[int] = []
    sources: list[Any] = [AutoConfig.from_pretrained(model_path)]
    with contextlib.suppress(OSError):  # no generation_config.json
        sources.append(GenerationConfig.from_pretrained(model_path))
    for source in sources:
        value = getattr(source, "eos_token_id", None)
        ids.extend(value if isinstance(value, list) else [value] if value is not None else [])
    if tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    ids = list(dict.fromkeys(ids))
    if not ids:
        raise ValueError(f"{model_path}: neither the tokenizer nor the configs define an end-of-sequence token")
    return ids


class VLLMEngine:
    """Construct once (blocks while vLLM starts, about a minute compiled, per engine); then use from one event loop.

    ``options`` (the ``--vllm.*`` group): ``options.num_engines`` engines start one after another on this process's
    GPU (vLLM sizes its KV cache from the memory free when it starts), each with
    ``gpu_memory_utilization / num_engines``; ``seed`` seeds them (``--train.seed``); ``extra_args``: more
    ``vllm.AsyncEngineArgs`` on top of ``engine_kwargs`` (e.g. a benchmark's profiler config)."""

    def __init__(
        self,
        model_path: str,
        options: VLLMConfig,
        *,
        seed: int = 0,
        tokenizer: Any = None,
        extra_args: dict[str, Any] | None = None,
        lora_rank: int = 0,
        record_routing: bool = False,
    ) -> None:
        try:
            from vllm import AsyncEngineArgs
            from vllm.v1.engine.async_llm import AsyncLLM
        except ImportError as exc:
            raise ImportError(f"{VLLM_INSTALL_HINT} ({exc})") from exc
        from transformers import AutoConfig, AutoTokenizer

        self.model_path = model_path
        self.options = options
        self.tokenizer = tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(model_path)
        self.stop_token_ids = eos_token_ids(model_path, self.tokenizer)
        # a forked engine process cannot use CUDA once this process has (a colocated trainer always has)
        os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
        n = self.options.num_engines
        kwargs = {**engine_kwargs(options, model_path, seed), **lora_kwargs(lora_rank), **(extra_args or {})}
        self.record_routing = record_routing
        self.routing_table: dict[tuple[tuple[int, ...], tuple[int, ...]], torch.Tensor] = {}
        if record_routing:  # vLLM refuses it at start-up for a dense model
            kwargs["enable_return_routed_experts"] = True
        self.reads_images = getattr(AutoConfig.from_pretrained(model_path), "vision_config", None) is not None
        if self.reads_images:
            kwargs["limit_mm_per_prompt"] = {"image": MAX_IMAGES, "video": 0}
            # vLLM 0.24's processor cache sends the prompt text to the HF processor without its images, which
            # transformers 5.24's input validation refuses ("Found 1 <|image_pad|> tokens ... no images"): without
            # the cache the text and its images are processed together
            kwargs.setdefault("mm_processor_cache_gb", 0)
        self.llms = []
        try:
            for _ in range(n):
                self.llms.append(AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs)))
        except BaseException:
            self.shutdown()  # the engines already up would otherwise hold their GPU memory until this process exits
            raise
        self.weight_version = 0
        self.lora_request: Any = None  # LoRA runs: the policy's current adapter (None: the base = a fresh adapter)
        self.stats = {"requests": 0, "generated_tokens": 0, "syncs": 0, "requests_per_engine": [0] * n}
        self.last_sync: dict[str, float] = {"wait_s": 0.0, "copy_s": 0.0, "bytes": 0, "buckets": 0}
        self._ids = itertools.count()
        self._inflight = [0] * n  # requests in flight per engine
        self._open: asyncio.Event | None = None  # cleared while a sync owns the engine
        self._sync_lock: asyncio.Lock | None = None

    # -- Engine protocol --
    async def generate(
        self, prompt_ids: list[int], params: SamplingParams, mm_inputs: VisionInputs | None = None
    ) -> Generation:
        from vllm import SamplingParams as VSamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        if mm_inputs and not self.reads_images:
            raise ValueError(f"{len(mm_inputs)} image(s) sent to a text-only model ({self.model_path})")
        prompt = TokensPrompt(prompt_token_ids=list(prompt_ids))
        if mm_inputs:  # vLLM expands each placeholder itself
            prompt = TokensPrompt(
                prompt_token_ids=mm_inputs.collapse(list(prompt_ids)),
                multi_modal_data={"image": list(mm_inputs.images)},
            )
        if not prompt_ids:
            raise ValueError("prompt_ids is empty; an engine needs at least one token to condition on")
        if params.max_tokens == 0:
            return Generation([], [], "length", {"weight_versions": (self.weight_version, self.weight_version)})
        await self._gate().wait()
        request = VSamplingParams(
            **sampling_kwargs(params, self.stop_token_ids), output_kind=RequestOutputKind.FINAL_ONLY
        )
        version = self.weight_version
        index = min(range(len(self.llms)), key=self._inflight.__getitem__)
        self._inflight[index] += 1
        self.stats["requests_per_engine"][index] += 1
        try:
            final = None
            async for output in self.llms[index].generate(
                prompt, request, f"molt-{next(self._ids)}", lora_request=self.lora_request
            ):
                final = output  # FINAL_ONLY: one output, when the request is done
        finally:
            self._inflight[index] -= 1
        if final is None:
            raise RuntimeError("vLLM ended the request without an output (engine shut down or request aborted)")
        completion = final.outputs[0]
        seen = list(final.prompt_token_ids or [])
        if mm_inputs and seen != list(prompt_ids) and seen != prompt["prompt_token_ids"]:
            raise RuntimeError(
                f"vLLM expanded the image placeholders into {len(seen)} prompt tokens where the trajectory has "
                f"{len(prompt_ids)}; its processor and the runner's disagree (same checkpoint directory?)"
            )
        if completion.finish_reason not in ("stop", "length"):
            raise RuntimeError(
                f"vLLM finished the request with {completion.finish_reason!r} (aborted or failed), "
                f"after {len(completion.token_ids)} tokens"
            )
        token_ids = list(completion.token_ids)
        if self.record_routing:
            if len(seen) != len(prompt_ids):
                raise RuntimeError(
                    f"vLLM's prompt has {len(seen)} tokens where the trajectory has {len(prompt_ids)}: its routing "
                    "cannot be aligned with the trajectory's positions"
                )
            self.routing_table[(tuple(prompt_ids), tuple(token_ids))] = vllm_routing(final, len(seen), len(token_ids))
        self.stats["requests"] += 1
        self.stats["generated_tokens"] += len(token_ids)
        return Generation(
            token_ids,
            sampled_logprobs(completion.logprobs, token_ids),
            completion.finish_reason,
            {"weight_versions": (version, self.weight_version)},
        )

    def routing_record(self, prompt_ids: list[int], token_ids: list[int]) -> torch.Tensor | None:
        """The routing recorded when ``token_ids`` were generated after ``prompt_ids`` (``record_routing``), None if
        this engine generated no such continuation."""
        return self.routing_table.get((tuple(prompt_ids), tuple(token_ids)))

    # -- weight sync --
    async def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Load CUDA tensors of this process (same GPU as the engine) through CUDA IPC; returns bytes moved."""

        async def load() -> tuple[int, int]:
            moved = buckets = 0
            for bucket in pack(named_tensors, self.options.bucket_bytes):
                await self._rpc("molt_load_ipc_bucket", share(bucket))
                moved, buckets = moved + bucket.nbytes, buckets + 1
                del bucket
            torch.cuda.ipc_collect()
            return moved, buckets

        return await self._exclusive_sync(load)

    async def load_lora_adapter(self, adapter_dir: str) -> int:
        """LoRA runs: serve the PEFT adapter in ``adapter_dir`` (the trainer's current one) to requests submitted
        from now on; requests in flight (paused ones too) keep the adapter they were submitted with. Returns the
        adapter's bytes."""
        from vllm.lora.request import LoRARequest

        path = Path(adapter_dir)
        nbytes = sum(f.stat().st_size for f in path.iterdir() if f.is_file())

        async def load() -> tuple[int, int]:
            version = self.weight_version + 1  # a fresh LoRA id per version: vLLM caches adapters by id
            self.lora_request = LoRARequest(f"molt-policy-{version}", version, str(path))
            return nbytes, 1

        return await self._exclusive_sync(load)

    async def load_shared_buckets(self, payloads: Sequence[bytes | Sequence[bytes]], nbytes: int) -> int:
        """Load buckets other processes packed and shared (``weight_buckets.share``); the sharers keep them alive
        until this returns. A bucket is one payload, or one per GPU (the same bucket shared by the trainer rank on
        each of the engine's GPUs: each worker opens its own GPU's). ``nbytes``: their total, for ``last_sync``."""

        async def load() -> tuple[int, int]:
            for payload in payloads:
                await self._rpc("molt_load_ipc_bucket", payload)
            return nbytes, len(payloads)

        return await self._exclusive_sync(load)

    async def init_weight_group(self, host: str, port: int, world_size: int) -> list[int]:
        """Join the NCCL group whose rank 0 is the trainer (``NcclWeightSender``, created concurrently): worker w
        (of ``gpus_per_engine``) of engine i is rank 1 + i x gpus_per_engine + w, so ``world_size`` = 1 +
        num_engines x gpus_per_engine. Returns the ranks the workers took."""
        span = self.options.gpus_per_engine
        ranks = await asyncio.gather(
            *(
                _all_workers(llm, "molt_init_nccl", (host, port, 1 + i * span, world_size))
                for i, llm in enumerate(self.llms)
            )
        )
        return [rank for engine in ranks for rank in engine]

    async def receive_broadcast(self, plan: Sequence[tuple[bytes, int]]) -> int:
        """Receive the buckets of ``NcclWeightSender.plan`` while the trainer broadcasts them, one RPC each."""

        async def load() -> tuple[int, int]:
            for metas, nbytes in plan:
                await self._rpc("molt_receive_nccl_bucket", metas, nbytes)
            return sum(nbytes for _, nbytes in plan), len(plan)

        return await self._exclusive_sync(load)

    async def check_weight_update_equal(
        self,
        named_tensors: Iterable[tuple[str, torch.Tensor]] | None = None,
        *,
        plan: Sequence[tuple[bytes, int]] | None = None,
        payloads: Sequence[bytes | Sequence[bytes]] | None = None,
    ) -> list[str]:
        """Names of vLLM parameters whose current value differs (bitwise) from the trainer's, as
        ``"stale: <name>"``, or that no trainer tensor reaches, as ``"uncovered: <name>"``, in any of the engines
        (each named once). Empty = in sync.

        The trainer's weights come again the way the sync brought them: ``named_tensors`` (CUDA IPC, this GPU),
        ``payloads`` (the shared buckets ``load_shared_buckets`` loaded, still alive) or ``plan`` (NCCL: the
        trainer's ``NcclWeightSender.send`` must run concurrently). Costs one more load plus a copy of the weights
        in engine memory; the engine is held meanwhile.
        """
        if sum(x is not None for x in (named_tensors, plan, payloads)) != 1:
            raise ValueError("pass exactly one of named_tensors or payloads (CUDA IPC) or plan (NCCL broadcast)")
        found: list[str] = []

        async def check() -> tuple[int, int]:
            await self._rpc("molt_begin_check")
            try:
                if plan is not None:
                    for metas, nbytes in plan:
                        await self._rpc("molt_receive_nccl_bucket", metas, nbytes)
                elif payloads is not None:
                    for payload in payloads:
                        await self._rpc("molt_load_ipc_bucket", payload)
                else:
                    for bucket in pack(named_tensors, self.options.bucket_bytes):
                        await self._rpc("molt_load_ipc_bucket", share(bucket))
                        del bucket
                    torch.cuda.ipc_collect()
            finally:
                reports = await self._rpc("molt_end_check")
            found.extend(
                sorted({f"{kind}: {name}" for r in reports for kind in ("stale", "uncovered") for name in r[kind]})
            )
            return 0, 0

        saved = dict(self.last_sync)
        await self._exclusive_sync(check, bump=False)
        self.last_sync = saved
        return found

    # -- pause / sleep --
    async def pause(self) -> None:
        """Freeze generation; requests in flight keep their KV cache and resume on ``resume``."""
        await asyncio.gather(*(llm.pause_generation(mode="keep", clear_cache=False) for llm in self.llms))

    async def resume(self) -> None:
        if self.options.enable_prefix_caching:  # cached prefixes were computed with the old weights
            await asyncio.gather(*(llm.reset_prefix_cache(reset_running_requests=True) for llm in self.llms))
        await asyncio.gather(*(llm.resume_generation() for llm in self.llms))

    async def sleep(self, level: int = 1) -> None:
        """Free the engines' GPU memory (level 1: weights to CPU, KV cache dropped); needs --vllm.enable_sleep."""
        if not self.options.enable_sleep:
            raise RuntimeError("sleep needs an engine started with --vllm.enable_sleep")
        await asyncio.gather(*(llm.sleep(level) for llm in self.llms))

    async def wake_up(self) -> None:
        await asyncio.gather(*(llm.wake_up() for llm in self.llms))

    def shutdown(self) -> None:
        for llm in self.llms:
            llm.shutdown()

    # -- internals --
    def _gate(self) -> asyncio.Event:
        if self._open is None:
            self._open = asyncio.Event()
            self._open.set()
            self._sync_lock = asyncio.Lock()
        return self._open

    async def _rpc(self, method: str, *args: Any) -> list[Any]:
        """``method`` on every worker of every engine at once; their answers in engine order."""
        answers = await asyncio.gather(*(_all_workers(llm, method, args) for llm in self.llms))
        return [answer for engine in answers for answer in engine]

    async def _exclusive_sync(self, body: Callable[[], Awaitable[tuple[int, int]]], bump: bool = True) -> int:
        """Run ``body`` with no decode step in between: new requests wait at the gate; requests in flight are
        paused (partial rollout) and continue afterwards on the new weights."""
        gate = self._gate()
        async with self._sync_lock:
            start = time.perf_counter()
            gate.clear()
            paused = sum(self._inflight) > 0
            try:
                if paused:
                    await self.pause()
                ready = time.perf_counter()
                moved, buckets = await body()
                done = time.perf_counter()
                if bump:
                    self.weight_version += 1
                    self.stats["syncs"] += 1
            finally:
                if paused:
                    await self.resume()
                gate.set()
        self.last_sync = {
            "wait_s": ready - start,
            "copy_s": done - ready,
            "bytes": moved,
            "buckets": buckets,
            "paused": float(paused),
        }
        return moved


async def _all_workers(llm: Any, method: str, args: tuple[Any, ...]) -> list[Any]:
    """``collective_rpc`` of ``method`` on every worker of ``llm`` and all their answers. With data-parallel
    replicas, vLLM's client sends a utility call to every engine core but returns the first core's answers only
    (``DPLBAsyncMPClient.call_utility_async``), so each core is asked on its own here."""
    core = llm.engine_core
    cores = list(getattr(core, "core_engines", None) or ())
    if len(cores) < 2:
        return await llm.collective_rpc(method, args=args)
    answers = await asyncio.gather(
        *(core._call_utility_async("collective_rpc", method, None, args, None, engine=c) for c in cores)
    )
    return [answer for replica in answers for answer in replica]


def broadcast_plan(
    named_tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int = BUCKET_BYTES
) -> list[tuple[bytes, int]]:
    """Per bucket: (its tensors' metadata as bytes, its size); what ``VLLMEngine.receive_broadcast`` takes."""
    plan = []
    for planned in plan_buckets(named_tensors, bucket_bytes):
        last = planned[-1][0]
        plan.append((pickle.dumps([meta.as_tuple() for meta, _ in planned]), last.offset + last.nbytes))
    return plan


class NcclWeightSender:
    """Trainer rank 0's side of the NCCL weight sync to engines on other GPUs.

    ``plan(named_tensors)`` gives the per-bucket metadata the engine needs (``VLLMEngine.receive_broadcast``);
    ``send(named_tensors)`` then packs and broadcasts the buckets in the same order, one NCCL call per bucket.
    """

    def __init__(
        self, host: str, port: int, world_size: int, device: int | None = None, bucket_bytes: int = BUCKET_BYTES
    ) -> None:
        try:
            from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator
            from vllm.distributed.utils import StatelessProcessGroup
        except ImportError as exc:
            raise ImportError(f"{VLLM_INSTALL_HINT} ({exc})") from exc
        self.device = torch.device("cuda", torch.cuda.current_device() if device is None else device)
        group = StatelessProcessGroup.create(host=host, port=port, rank=0, world_size=world_size)
        self.comm = PyNcclCommunicator(group, device=self.device)
        self.bucket_bytes = bucket_bytes

    def plan(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> list[tuple[bytes, int]]:
        return broadcast_plan(named_tensors, self.bucket_bytes)

    def send(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Broadcast every bucket (blocks until the last one left this GPU); returns bytes sent."""
        sent = 0
        stream = torch.cuda.current_stream(self.device)
        for bucket in pack(named_tensors, self.bucket_bytes, device=self.device):
            # same stream as the packing copies; a freed buffer is only reused by later work on this stream
            self.comm.broadcast(bucket.buffer, src=0, stream=stream)
            sent += bucket.nbytes
        stream.synchronize()
        return sent


__all__ = [
    "NcclWeightSender",
    "broadcast_plan",
    "VLLMEngine",
    "engine_kwargs",
    "eos_token_ids",
    "sampled_logprobs",
    "sampling_kwargs",
]
