"""Training-phase MFU of the trainer's own ``PolicyWorker`` (FSDP2, one rank) on the GRPO step's workload.

    python3 benchmarks/gpu/train_mfu_bench.py --model DIR [--param-dtype bfloat16|float32] [--compile] [--steps 3]
        [--profile] [--offload]

256 sequences (32 prompts x 8 samples) of 128 prompt + 512 response tokens, random ids (what a random-weight model
generates), random group-normalised advantages. Per step, as the trainer runs it: ``logprobs`` (pi_old recompute,
forward only) then ``train_step`` (the ``molt-train rl`` config of ``grpo_step_bench.bench_config``: PPO loss,
token-mean, one optimizer step) over the trainer's micro-batch plan (``worker_group.spread``: ``--micro-rows`` rows,
``--max-tokens`` tokens). MFU = model FLOPs (6 x matmul parameters x
tokens + causal attention; forward only: 2x) / time / 790 TFLOP/s, as in ``grpo_step_bench.py``. Each variant runs
in its own process (``PolicyWorker`` owns the process group). ``--profile`` runs one more step under
``torch.profiler`` and prints where the GPU time went (operators and kernels, then by input shape). ``--offload``
runs the rank with ``--fsdp.offload optimizer`` (fp32 weights, gradients and AdamW states in CPU memory): run it
beside a plain run for the memory and step-time cost of the offload.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grpo_step_bench import (  # noqa: E402
    PEAK_FLOPS,
    add_workload_args,
    bench_config,
    count_matmul_params,
    local_port,
    model_flops,
)
from shapes import record  # noqa: E402


def experience(args: argparse.Namespace, vocab: int):
    import torch

    from molt_train.experience import Experience

    g = torch.Generator().manual_seed(0)
    n, length = args.prompts * args.samples, args.prompt_len + args.new_tokens
    ids = torch.randint(3, vocab, (n, length), generator=g)
    for i in range(n):  # the samples of a prompt share it
        ids[i, : args.prompt_len] = ids[i - i % args.samples, : args.prompt_len]
    action = torch.zeros((n, length - 1), dtype=torch.bool)
    action[:, args.prompt_len - 1 :] = True
    rewards = torch.rand(n, generator=g).view(args.prompts, args.samples)
    adv = ((rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-6)).view(n, 1) * action
    return Experience(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        action_mask=action,
        rollout_logp=torch.full((n, length - 1), -11.9) * action,
        rewards=rewards.view(n),
        lengths=torch.full((n,), length),
        truncated=torch.zeros(n, dtype=torch.bool),
        group_ids=[str(i // args.samples) for i in range(n)],
        rollout_ids=[str(i) for i in range(n)],
        scores=[None] * n,
        advantages=adv,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    add_workload_args(parser)
    parser.add_argument("--max-tokens", type=int, default=32768)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--offload", action="store_true", help="--fsdp.offload optimizer")
    args = parser.parse_args()

    import torch

    from molt_train.config.fsdp import FSDPConfig
    from molt_train.policy_worker import PolicyWorker
    from molt_train.worker_group import loss_window, spread

    start = time.perf_counter()
    cfg = bench_config(args)
    fsdp = FSDPConfig(offload="optimizer" if args.offload else "none")
    worker = PolicyWorker(
        0, 1, "127.0.0.1", local_port(), cfg.actor, args.model, seed=0, total_steps=args.steps, fsdp=fsdp
    )
    config = worker.config
    matmul_params = count_matmul_params(worker)
    exp = experience(args, config.vocab_size)
    _, (micros,) = spread(exp, 0, 1, cfg.train)
    lengths = exp.lengths.tolist()
    window = loss_window(exp, cfg.actor.loss_agg_mode)
    variant = f"{args.param_dtype}{'+compile' if args.compile else ''}{'+offload' if args.offload else ''}"
    print(
        f"{variant}: worker ready in {time.perf_counter() - start:.1f}s, {matmul_params / 1e6:.0f}M matmul params, "
        f"{len(micros)} micro-batches of {args.micro_rows} rows",
        flush=True,
    )

    def sync() -> None:  # cpu: a dry run of this script
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    def step_once() -> tuple[float, float, float, dict]:
        sync()
        t0 = time.perf_counter()
        old = worker.logprobs(micros, 1.0)
        sync()
        t1 = time.perf_counter()
        for mb, logp in zip(micros, old, strict=True):
            mb["extra"] = {"logp_old": logp}
        out = worker.train_step(micros, window, cfg.algo, cfg.sampling_temperature)
        sync()
        return t0, t1, time.perf_counter(), out

    for step in range(args.steps):
        t0, t1, t2, out = step_once()
        result = {
            "variant": variant,
            "step": step,
            "tokens": sum(lengths),
            "logprob_s": t1 - t0,
            "training_s": t2 - t1,
            "logprob_mfu": model_flops(config, lengths, matmul_params, 1) / (t1 - t0) / PEAK_FLOPS,
            "training_mfu": model_flops(config, lengths, matmul_params, 3) / (t2 - t1) / PEAK_FLOPS,
            "training_tok_per_s": sum(lengths) / (t2 - t1),
            "loss": out["loss"],
            "grad_norm": out["grad_norm"],
            "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else 0.0,
        }
        record(f"train_mfu_{args.tag}_{variant}", result)
        print(
            f"{variant} step {step}: logprob {t1 - t0:.2f}s ({result['logprob_mfu']:.1%}), train {t2 - t1:.2f}s "
            f"({result['training_mfu']:.1%} MFU, {result['training_tok_per_s'] / 1e3:.0f}K tok/s), "
            f"peak {result['peak_mem_gib']:.0f} GiB",
            flush=True,
        )
    if args.profile:
        profile(step_once)
    worker.shutdown()


def profile(step_once) -> None:
    """One step under torch.profiler: the operators and kernels with the most GPU time, then by input shape."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        step_once()
    print(prof.key_averages().table(sort_by="self_device_time_total", row_limit=25, max_name_column_width=90))
    print(
        prof.key_averages(group_by_input_shape=True).table(
            sort_by="self_device_time_total", row_limit=25, max_name_column_width=40, max_shapes_column_width=120
        )
    )


if __name__ == "__main__":
    main()
