"""One colocated GRPO step on one GPU: vLLM generates, the trainer's policy recomputes log-probs and trains, weights sync.

    python3 benchmarks/gpu/grpo_step_bench.py --model DIR [--steps 3] [--param-dtype bfloat16] [--compile]
        [--overlap] [--engines K] [--no-recompute]

The run is configured as ``molt-train rl`` is: ``bench_config`` parses the same flags into the same ``RLConfig``
(``--algo.advantage.estimator grpo --rollout.engine vllm --train.colocate_all``, ...), and every phase calls the
trainer's own functions on it. vLLM (``VLLMEngine(cfg.vllm)``, gpu_memory_utilization 0.35) and the trainer's
``PolicyWorker(cfg.actor)`` (one FSDP2 rank on NCCL, fp32 master weights, ``--param-dtype`` compute, SDPA, AdamW)
stay resident on the same GPU: no sleep/wake. Ray is left out; everything else is the trainer's code path. Per step:
  generation   32 prompts x 8 samples through ``engine.generate`` (temperature 1, up to 512 new tokens)
  logprob      ``rl_batch.shape_and_filter`` + ``rl_batch.estimate_advantages`` (GRPO, milliseconds), then
               ``PolicyWorker.logprobs``: the recompute of the sampled tokens' log-probs (pi_old)
  training     ``PolicyWorker.train_step(..., cfg.algo)`` (the trainer's ``rl_loss``: PPO, token-mean, one optimizer
               step over all 256 sequences in micro-batches of ``--micro-rows``, ``worker_group.spread``)
  weight sync  ``PolicyWorker.share_weights`` (bf16 buckets) + ``engine.load_shared_buckets`` (CUDA IPC into vLLM's
               ``load_weights``), as the trainer's colocated sync
``--engines K``: ``--vllm.num_engines K``, K engine processes share the GPU (and the 0.35 of its memory).
``--no-recompute``: the trainer's own path for this workload (one optimizer step takes the whole batch, so pi_old
is the training forward's log-probs, detached: ``molt-train rl`` skips the recompute); the log-prob phase is then
empty and the mismatch metrics come from ``train_step`` (computed there against the same forward).
``--overlap`` runs the trainer's overlapped schedule (``--no-train.force_sync_mode``: queue 1, no partial rollout): step k's
generation of batch k+1 is started as step k takes batch k (its requests go out at the first ``await``, once the
micro-batches are built, ~0.1 s later) and runs beside its log-prob and training phases; the sync then waits for it
(``wait``). Here the policy works in a thread of the engine client's process (the trainer runs it as a Ray actor
of its own), so the two share a GIL as well as the GPU. Step time = from taking batch k to the end of its sync. The batch trains one
update stale (what IS correction is for), so the mismatch metrics of ``--overlap`` runs include that update.
Then, outside the timed step: ``engine.check_weight_update_equal`` over every vLLM parameter and the mismatch
metrics (``algorithms.mismatch_metrics``) between vLLM's log-probs and the recompute.
Training MFU = model FLOPs (6 x matmul params x tokens + causal attention) / training time / 790 TFLOP/s.
Rewards are synthetic (fraction of even token ids, a deterministic function of the response): the model is random.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

T_START = time.perf_counter()  # the run's wall time counts from here (imports included): the time to a first step

sys.path.insert(0, str(Path(__file__).resolve().parent))
from shapes import random_prompts, record  # noqa: E402

PEAK_FLOPS = 790e12  # bf16 dense, measured on this H200 (KINDS.md)


def add_workload_args(parser: argparse.ArgumentParser) -> None:
    """The GRPO step's workload and the trainer worker's settings (this bench and ``train_mfu_bench.py``)."""
    parser.add_argument("--model", required=True)
    parser.add_argument("--tag", default="0.6b")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=512)
    parser.add_argument("--micro-rows", type=int, default=32)
    parser.add_argument("--chunk", type=int, default=4096)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--param-dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--compile", action="store_true")


def bench_config(args: argparse.Namespace, *flags: str):
    """The ``molt-train rl`` config of this workload (AdamW (0.9, 0.95), grad clip 1.0, constant LR, no activation
    checkpointing, PPO token-mean, GRPO), parsed from the trainer's own flags; ``flags``: more of them."""
    from molt_train.config import parse

    return parse(
        "rl",
        [
            "--env",
            "molt/gsm8k-v1",
            "--actor.model_name_or_path",
            args.model,
            "--ckpt.output_dir",
            "unused",
            "--algo.advantage.estimator",
            "grpo",
            "--rollout.n_samples_per_prompt",
            str(args.samples),
            "--rollout.batch_size",
            str(args.prompts),
            "--rollout.max_new_tokens",
            str(args.new_tokens),
            "--data.max_len",
            str(args.prompt_len + args.new_tokens),
            "--train.seed",
            "0",
            "--train.micro_batch_size",
            str(args.micro_rows),
            "--train.max_tokens_per_gpu",
            str(getattr(args, "max_tokens", 1 << 20)),
            "--actor.adam.lr",
            str(args.lr),
            "--actor.logprob_chunk_size",
            str(args.chunk),
            "--actor.param_dtype",
            args.param_dtype,
            "--actor.compile" if args.compile else "--no-actor.compile",
            *flags,
        ],
    )


def local_port() -> int:
    """A free TCP port for the worker's process group (two benches can then share a machine)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def count_matmul_params(worker) -> int:
    """Parameters that multiply activations: all but the embedding, plus a tied lm_head (a matmul of its own)."""
    config = worker.config
    params = sum(p.numel() for n, p in worker.model.named_parameters() if "embed_tokens" not in n)
    return params + (config.vocab_size * config.hidden_size if config.tie_word_embeddings else 0)


def model_flops(cfg, lengths: list[int], matmul_params: int, passes: int) -> float:
    """``passes`` = 1 (forward), 3 (forward + backward)."""
    q_dim = cfg.num_attention_heads * cfg.head_dim
    attention = sum(cfg.num_hidden_layers * 2 * q_dim * s * s for s in lengths)  # causal QK^T + AV: 4*q*S^2/2
    return passes * (2 * matmul_params * sum(lengths) + attention)


async def main_async(args: argparse.Namespace) -> None:
    import torch

    from molt_envs import SamplingParams, Trajectory
    from molt_train.algorithms import mismatch_metrics
    from molt_train.engines.vllm import VLLMEngine
    from molt_train.experience import make_experience
    from molt_train.policy_worker import PolicyWorker
    from molt_train.rl_batch import estimate_advantages, shape_and_filter
    from molt_train.worker_group import loss_window, spread

    cfg = bench_config(
        args,
        "--rollout.engine",
        "vllm",
        "--train.colocate_all",
        "--vllm.gpu_memory_utilization",
        str(args.gpu_memory_utilization),
        "--vllm.max_model_len",
        "1024",
        "--vllm.max_num_seqs",
        str(args.max_num_seqs),
        "--vllm.max_num_batched_tokens",
        "16384",
        "--vllm.num_engines",
        str(args.engines),
        *([] if args.vllm_compile else ["--no-vllm.compile"]),
    )
    if args.dynamic_first:  # compile every shape symbolic from the first call (no static compile, then a dynamic one)
        import torch._dynamo

        torch._dynamo.config.assume_static_by_default = False
    t0 = time.perf_counter()
    engine = VLLMEngine(args.model, cfg.vllm, seed=cfg.train.seed)
    t_engine = time.perf_counter() - t0
    device = "cuda" if torch.cuda.is_available() else "cpu"
    temperature = cfg.sampling_temperature

    def synchronize() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    worker = PolicyWorker(
        0, 1, "127.0.0.1", local_port(), cfg.actor, args.model, seed=cfg.train.seed, total_steps=args.steps
    )
    model_cfg = worker.config
    matmul_params = count_matmul_params(worker)
    print(
        f"engine {t_engine:.1f}s, policy loaded {time.perf_counter() - t0:.1f}s; matmul params "
        f"{matmul_params / 1e6:.0f}M; {time.perf_counter() - T_START:.1f}s since start",
        flush=True,
    )

    async def sync(check: bool) -> list[str]:
        """The trainer's colocated sync: rank 0 packs buckets, the engine loads them by CUDA IPC."""
        payloads, nbytes = worker.share_weights(cfg.vllm.dtype, cfg.vllm.bucket_bytes)
        try:
            await engine.load_shared_buckets(payloads, nbytes)
            if not check:
                return []
            # the trainer's weights again, as the engine sees them (this process cannot open its own IPC handles)
            state = worker.full_state_dict(cpu_offload=False)
            return await engine.check_weight_update_equal([(k, v.to(torch.bfloat16)) for k, v in state.items()])
        finally:
            worker.release_shared()

    if args.check:
        initial = await sync(check=True)
        print(f"before training: {len(initial)} vLLM params differ from the policy's {initial[:3]}", flush=True)

    prompts = random_prompts(args.prompts, args.prompt_len, model_cfg.vocab_size, seed=1)
    rows = [(i, j) for i in range(args.prompts) for j in range(args.samples)]

    async def generate(step: int) -> tuple[list, float]:
        """One step's 256 generations and their wall time."""
        start = time.perf_counter()
        params = [
            SamplingParams(
                temperature=cfg.rollout.temperature, max_tokens=args.new_tokens, seed=step * 100000 + i * 100 + j
            )
            for i, j in rows
        ]
        gens = await asyncio.gather(*[engine.generate(prompts[i], sp) for (i, _), sp in zip(rows, params, strict=True)])
        return gens, time.perf_counter() - start

    pending = asyncio.create_task(generate(0))
    for step in range(args.steps):
        synchronize()
        s0 = time.perf_counter()
        if not args.overlap and step > 0:
            pending = asyncio.create_task(generate(step))
        gens, generation_s = await pending  # --overlap: generated during the step before (on its weights)
        if args.overlap:  # rollout k+1 overlaps training k (the trainer's Q=1; after the last step: discarded)
            pending = asyncio.create_task(generate(step + 1))
        s1 = time.perf_counter()

        trajs = []
        for (i, j), g in zip(rows, gens, strict=True):
            t = Trajectory(
                group_id=str(i),
                rollout_id=f"{i}:{j}",  # synthetic reward: share of even token ids
                reward=sum(tok % 2 == 0 for tok in g.token_ids) / max(len(g.token_ids), 1),
            )
            t.append_observation(prompts[i])
            t.append_action(g.token_ids, g.log_probs)
            trajs.append(t)
        exp = make_experience(trajs, max_len=cfg.data.max_len, pad_id=0)
        lengths = exp.lengths.tolist()
        # the trainer's preparation: reward shaping, then GRPO advantages (milliseconds) before the micro-batches
        exp, _ = shape_and_filter(exp, cfg)
        estimate_advantages(exp, cfg)
        _, (micros,) = spread(exp, 0, 1, cfg.train)
        # in a thread, so that the event loop keeps feeding the engine meanwhile (--overlap)
        old = [] if args.no_recompute else await asyncio.to_thread(worker.logprobs, micros, temperature)
        await asyncio.to_thread(synchronize)
        s2 = time.perf_counter()

        for mb, logp in zip(micros, old, strict=True) if old else ():  # none with --no-recompute
            mb["extra"] = {"logp_old": logp}
        window = loss_window(exp, cfg.actor.loss_agg_mode)
        num_tokens = window["num_tokens"]
        out = await asyncio.to_thread(worker.train_step, micros, window, cfg.algo, temperature)
        await asyncio.to_thread(synchronize)
        s3 = time.perf_counter()
        if args.overlap:
            await pending  # the trainer's sync waits for the batch in flight (no partial rollout)
        s3b = time.perf_counter()

        await sync(check=False)
        s4 = time.perf_counter()
        last = dict(engine.last_sync)

        since_start = time.perf_counter() - T_START
        stale = await sync(check=True) if args.check else []
        if args.no_recompute:  # train_step's token-weighted sums of the metrics its loss computed
            mismatch = {k: v / num_tokens for k, v in out["weighted"].items() if k.startswith("mismatch/")}
        else:
            mismatch = {
                k: float(v)
                for k, v in mismatch_metrics(
                    torch.cat([lp[mb["action_mask"]] for lp, mb in zip(old, micros, strict=True)]),
                    torch.cat([mb["rollout_logp"][mb["action_mask"]] for mb in micros]),
                    torch.ones(num_tokens, dtype=torch.bool),
                ).items()
            }
        generated = gens
        if args.overlap:
            generated, generation_s = pending.result()  # the batch generated during this step
        gen_tokens = sum(len(g.token_ids) for g in gens)
        train_flops = model_flops(model_cfg, lengths, matmul_params, passes=3)
        result = {
            "step": step,
            "sequences": len(rows),
            "generated_tokens": gen_tokens,
            "total_tokens": sum(lengths),
            "overlap": args.overlap,
            "engines": args.engines,
            "recompute": not args.no_recompute,
            "step_s": s4 - s0,
            "since_start_s": since_start,
            "generation_s": generation_s,
            "logprob_s": s2 - s1,
            "training_s": s3 - s2,
            "wait_generation_s": s3b - s3,
            "weight_sync_s": s4 - s3b,
            "sync_wait_s": last["wait_s"],
            "sync_copy_s": last["copy_s"],
            "sync_bytes": last["bytes"],
            "sync_buckets": last["buckets"],
            "generation_tok_per_s": sum(len(g.token_ids) for g in generated) / generation_s,
            "training_tflops": train_flops / (s3 - s2) / 1e12,
            "training_mfu": train_flops / (s3 - s2) / PEAK_FLOPS,
            "logprob_mfu": 0.0
            if args.no_recompute
            else model_flops(model_cfg, lengths, matmul_params, passes=1) / (s2 - s1) / PEAK_FLOPS,
            "stale_after_sync": stale,
            "grad_norm": out["grad_norm"],
            "loss": out["loss"],
            "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else 0.0,
            **mismatch,
        }
        record(f"grpo_step{step}_{args.tag}", result)
        gen_part = f"(gen {generation_s:.2f} beside) " if args.overlap else f"gen {generation_s:.2f} + "
        print(
            f"step {step}: {result['step_s']:.2f}s = {gen_part}logprob "
            f"{result['logprob_s']:.2f} + train {result['training_s']:.2f} + wait {s3b - s3:.2f} + sync "
            f"{result['weight_sync_s']:.3f} "
            f"(wait {last['wait_s']:.4f}, copy {last['copy_s']:.4f}); MFU {result['training_mfu']:.1%}; "
            f"stale {len(stale)}; bitwise_frac {mismatch['mismatch/bitwise_frac']:.3f} "
            f"abs_diff {mismatch['mismatch/abs_diff_mean']:.4f} k3 {mismatch['mismatch/k3_kl']:.2e}; "
            f"{since_start:.1f}s since start",
            flush=True,
        )

    syncs = []
    for _ in range(args.sync_reps):
        synchronize()
        start = time.perf_counter()
        await sync(check=False)
        syncs.append((time.perf_counter() - start, dict(engine.last_sync)))
    record(f"weight_sync_ipc_{args.tag}", {"total_s": [s for s, _ in syncs], "detail": [d for _, d in syncs]})
    worker.shutdown()
    engine.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser()
    add_workload_args(parser)
    parser.add_argument("--sync-reps", type=int, default=5)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.35)
    parser.add_argument("--max-num-seqs", type=int, default=1024, help="per engine")
    parser.add_argument("--engines", type=int, default=1, help="vLLM engines sharing the GPU (--vllm.num_engines)")
    parser.add_argument(
        "--no-recompute",
        action="store_true",
        help="pi_old from the training forward, as the trainer does when one step takes the batch",
    )
    parser.add_argument(
        "--overlap",
        action="store_true",
        help="generate step k+1 while step k trains, the trainer's --no-train.force_sync_mode",
    )
    parser.add_argument(
        "--no-vllm-compile",
        dest="vllm_compile",
        action="store_false",
        help="--no-vllm.compile: full decode CUDA graphs, no torch.compile in vLLM (a faster start)",
    )
    parser.add_argument(
        "--dynamic-first",
        action="store_true",
        help="the policy's compiled layers take symbolic shapes from the first call (one compile, not two)",
    )
    parser.add_argument(
        "--no-check",
        dest="check",
        action="store_false",
        help="skip the bench's own checks (vLLM's weights against the policy's after every sync): a run's wall time",
    )
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
