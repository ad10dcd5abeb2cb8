"""Rollout throughput: our vLLM engine vs our HF engine, N concurrent prompts x T new tokens, log-probs on.

    python3 benchmarks/gpu/rollout_bench.py --engine vllm|hf --model DIR --concurrency 256 1024 --new-tokens 256

Every request goes through the ``Engine`` protocol (``await engine.generate(ids, SamplingParams)``), all N issued
at once with asyncio; temperature 1, no stop tokens (every response is exactly T tokens), a seed per request (vLLM).
Output tok/s = N x T / wall time of the batch (prefill included). Two repetitions after a warm-up; best reported.
``--engines K`` (vLLM): ``--vllm.num_engines K``, K engines share the GPU, each with 1/K of the memory; a request
goes to the engine with the fewest in flight.
``--tp T`` (vLLM): one engine over the first T visible GPUs (``--vllm.tensor_parallel_size T``).
``--profile DIR`` (vLLM): then one more batch of the first N with vLLM's torch profiler on 32 decode steps (after
8 steps); the engine writes its per-kernel CUDA time table under DIR, and the step's wall time is printed beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from shapes import random_prompts, record  # noqa: E402

from molt_envs import SamplingParams  # noqa: E402


async def run_batch(engine, prompts: list[list[int]], new_tokens: int, seeded: bool) -> tuple[float, int]:
    start = time.perf_counter()
    outs = await asyncio.gather(
        *[
            engine.generate(
                p, SamplingParams(temperature=1.0, max_tokens=new_tokens, stop_token_ids=[], seed=i if seeded else None)
            )
            for i, p in enumerate(prompts)
        ]
    )
    wall = time.perf_counter() - start
    tokens = sum(len(o.token_ids) for o in outs)
    assert all(len(o.log_probs) == len(o.token_ids) for o in outs), "log-probs missing"
    assert all(lp <= 0.0 for o in outs for lp in o.log_probs), "a log-prob above 0"
    return wall, tokens


async def ab_logprobs(engine, prompts: list[list[int]], args: argparse.Namespace) -> None:
    """Batches with vLLM's sampled-token log-probs (the engine's requests) and without (the same requests straight
    to vLLM with ``logprobs=None``), alternating: what returning log-probs costs per decode step."""
    from vllm import SamplingParams as VSamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    from molt_train.engines.vllm import sampling_kwargs

    async def bare(i: int, prompt: list[int]) -> int:
        kw = sampling_kwargs(SamplingParams(temperature=1.0, max_tokens=args.new_tokens, stop_token_ids=[], seed=i), [])
        request = VSamplingParams(**{**kw, "logprobs": None}, output_kind=RequestOutputKind.FINAL_ONLY)
        async for out in engine.llms[0].generate(
            TokensPrompt(prompt_token_ids=prompt), request, f"ab-{i}-{time.time()}"
        ):
            final = out
        assert final.outputs[0].logprobs is None
        return len(final.outputs[0].token_ids)

    for rep in range(args.reps):
        wall, tokens = await run_batch(engine, prompts, args.new_tokens, seeded=True)
        start = time.perf_counter()
        bare_tokens = sum(await asyncio.gather(*[bare(i, p) for i, p in enumerate(prompts)]))
        bare_wall = time.perf_counter() - start
        print(
            f"ab {rep}: with log-probs {tokens / wall:.0f} tok/s, without {bare_tokens / bare_wall:.0f} tok/s",
            flush=True,
        )


async def bench(engine, name: str, args: argparse.Namespace, vocab: int) -> None:
    # seeded requests on the hf engine fail on CUDA (it draws with a CPU torch.Generator): unseeded there
    seeded = args.engine == "vllm"
    await run_batch(engine, random_prompts(8, args.prompt_len, vocab, seed=99), 8, seeded)  # warm-up
    for n in args.concurrency:
        new_tokens = args.new_tokens
        if args.engine == "hf" and n > 256 and args.hf_large_new_tokens:
            new_tokens = args.hf_large_new_tokens  # HF at 1024 x 256 would take minutes of device time
        prompts = random_prompts(n, args.prompt_len, vocab, seed=n)
        runs = []
        for _ in range(args.reps):
            wall, tokens = await run_batch(engine, prompts, new_tokens, seeded)
            runs.append((wall, tokens))
            print(
                f"{name} N={n} T={new_tokens}: {tokens} tokens in {wall:.2f}s = {tokens / wall:.0f} tok/s", flush=True
            )
        best = min(runs)
        record(
            f"rollout_{args.engine}_{n}"
            + (f"_x{args.engines}" if args.engines > 1 else "")
            + (f"_tp{args.tp}" if args.tp > 1 else ""),
            {
                "engine": args.engine,
                "engines": args.engines,
                "tensor_parallel_size": args.tp,
                "concurrency": n,
                "new_tokens": new_tokens,
                "prompt_len": args.prompt_len,
                "wall_s": [r[0] for r in runs],
                "tok_per_s": best[1] / best[0],
                "model": args.model,
            },
        )
    if args.ab_logprobs:
        await ab_logprobs(engine, random_prompts(args.concurrency[0], args.prompt_len, vocab, seed=1), args)
    if args.profile:
        n, steps = args.concurrency[0], 32
        prompts = random_prompts(n, args.prompt_len, vocab, seed=n)
        await engine.llms[0].start_profile()
        wall, tokens = await run_batch(engine, prompts, 8 + steps + 8, seeded)
        await engine.llms[0].stop_profile()
        print(
            f"profiled: N={n}, {8 + steps + 8} new tokens in {wall:.2f}s ({wall / (16 + steps) * 1e3:.1f} ms per "
            f"step, prefill included); CUDA time per kernel: {args.profile}",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--engine", choices=["vllm", "hf"], required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--hf-large-new-tokens", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    parser.add_argument("--eager", action="store_true")
    parser.add_argument("--max-num-seqs", type=int, default=1024, help="per engine")
    parser.add_argument("--engines", type=int, default=1, help="vLLM engines sharing the GPU (--vllm.num_engines)")
    parser.add_argument("--tp", type=int, default=1, help="GPUs one vLLM engine spans (--vllm.tensor_parallel_size)")
    parser.add_argument("--ab-logprobs", action="store_true", help="then batches with and without log-probs (vLLM)")
    parser.add_argument("--profile", default="", help="directory for vLLM's profiler output (vLLM only)")
    args = parser.parse_args()
    if args.profile and args.engines > 1:
        parser.error("--profile traces one engine; run it with --engines 1")

    import torch
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(args.model).vocab_size
    if args.engine == "hf":
        from molt_train.engines.hf import HFEngine

        engine = HFEngine.from_pretrained(
            args.model, device="cuda", dtype=torch.bfloat16, max_batch_size=max(args.concurrency), batch_window_s=0.05
        )
        asyncio.run(bench(engine, "hf", args, vocab))
        return
    from molt_train.config import VLLMConfig
    from molt_train.engines.vllm import VLLMEngine

    start = time.perf_counter()
    profiler = {
        "profiler_config": {
            "profiler": "torch",
            "torch_profiler_dir": str(Path(args.profile).resolve()),
            "ignore_frontend": True,
            "torch_profiler_with_stack": False,
            "delay_iterations": 8,
            "max_iterations": 32,
        }
    }
    options = VLLMConfig(
        gpu_memory_utilization=args.gpu_memory_utilization,
        enforce_eager=args.eager,
        max_model_len=1024,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=16384,
        num_engines=args.engines,
        tensor_parallel_size=args.tp,
    )

    async def go() -> None:
        engine = VLLMEngine(args.model, options, extra_args=profiler if args.profile else None)
        print(
            f"vllm engine(s) up in {time.perf_counter() - start:.1f}s (eager={args.eager}, {args.engines})", flush=True
        )
        await bench(engine, f"vllm x{args.engines}", args, vocab)
        print(f"requests per engine: {engine.stats['requests_per_engine']}", flush=True)
        engine.shutdown()

    asyncio.run(go())


if __name__ == "__main__":
    main()
