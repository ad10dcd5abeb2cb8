"""One colocated GRPO step on one GPU: vLLM generates, a torch policy recomputes log-probs and trains, weights sync.

    python3 benchmarks/gpu/grpo_step_bench.py --model DIR [--steps 3] [--prompts 32 --samples 8 --new-tokens 512]

vLLM (``VLLMEngine``, gpu_memory_utilization 0.35) and the policy (HF transformers, fp32 master weights, bf16
autocast, SDPA, fused AdamW) stay resident on the same GPU: no sleep/wake. Per step:
  generation   32 prompts x 8 samples through ``engine.generate`` (temperature 1, up to 512 new tokens)
  logprob      the policy's recompute of the sampled tokens' log-probs (``policy_worker.LogProbModel``, chunked)
  training     GRPO advantages (``algorithms.get_estimator("grpo")``) + PPO loss (``algorithms.ppo_loss``,
               token-mean), one optimizer step over all 256 sequences in micro-batches
  weight sync  ``engine.update_weights`` (bf16 buckets by CUDA IPC into vLLM's ``load_weights``)
then, outside the timed step: ``engine.check_weight_update_equal`` over every vLLM parameter and the mismatch
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from shapes import random_prompts, record  # noqa: E402

PEAK_FLOPS = 790e12  # bf16 dense, measured on this H200 (KINDS.md)


def model_flops(cfg, lengths: list[int], matmul_params: int, passes: int) -> float:
    """``passes`` = 1 (forward), 3 (forward + backward)."""
    q_dim = cfg.num_attention_heads * cfg.head_dim
    attention = sum(cfg.num_hidden_layers * 2 * q_dim * s * s for s in lengths)  # causal QK^T + AV: 4*q*S^2/2
    return passes * (2 * matmul_params * sum(lengths) + attention)


def build_batch(prompts, gens, device):
    import torch

    lengths = [len(p) + len(g.token_ids) for p, g in zip(prompts, gens, strict=True)]
    width = max(lengths)
    n = len(prompts)
    ids = torch.zeros((n, width), dtype=torch.long)
    attn = torch.zeros((n, width), dtype=torch.long)
    mask = torch.zeros((n, width - 1), dtype=torch.bool)
    rollout = torch.zeros((n, width - 1), dtype=torch.float32)
    for i, (p, g) in enumerate(zip(prompts, gens, strict=True)):
        seq = p + g.token_ids
        ids[i, :len(seq)] = torch.tensor(seq)
        attn[i, :len(seq)] = 1
        mask[i, len(p) - 1:len(seq) - 1] = True
        rollout[i, len(p) - 1:len(seq) - 1] = torch.tensor(g.log_probs, dtype=torch.float32)
    return ids.to(device), attn.to(device), mask.to(device), rollout.to(device), lengths


async def main_async(args: argparse.Namespace) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from molt_envs import SamplingParams
    from molt_train.algorithms import AdvantageInputs, aggregate, get_estimator, mismatch_metrics, ppo_loss
    from molt_train.engines.vllm import VLLMEngine, VLLMOptions
    from molt_train.policy_worker import LogProbModel

    t0 = time.perf_counter()
    engine = VLLMEngine(args.model, VLLMOptions(gpu_memory_utilization=args.gpu_memory_utilization,
                                                max_model_len=1024, max_num_seqs=1024, max_num_batched_tokens=16384))
    t_engine = time.perf_counter() - t0
    cfg = AutoConfig.from_pretrained(args.model)
    device = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: a dry run of this script with a stand-in engine

    def synchronize() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    policy = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32, attn_implementation="sdpa").to(device)
    policy.config.use_cache = False
    lp_model = LogProbModel(policy, chunk_size=args.chunk)
    optim = torch.optim.AdamW(policy.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0, fused=True)
    matmul_params = sum(p.numel() for n, p in policy.named_parameters() if "embed_tokens" not in n)
    if cfg.tie_word_embeddings:
        matmul_params += policy.get_input_embeddings().weight.numel()  # the tied lm_head is a matmul
    print(f"engine {t_engine:.1f}s, policy loaded {time.perf_counter() - t0:.1f}s; matmul params "
          f"{matmul_params / 1e6:.0f}M", flush=True)

    def bf16_weights():
        return [(n, p.detach().to(torch.bfloat16)) for n, p in policy.named_parameters()]

    initial = await engine.check_weight_update_equal(bf16_weights())
    print(f"before training: {len(initial)} vLLM params differ from the policy's {initial[:3]}", flush=True)

    prompts = random_prompts(args.prompts, args.prompt_len, cfg.vocab_size, seed=1)
    estimator = get_estimator("grpo")
    for step in range(args.steps):
        synchronize()
        s0 = time.perf_counter()
        rows = [(i, j) for i in range(args.prompts) for j in range(args.samples)]
        params = [SamplingParams(temperature=1.0, max_tokens=args.new_tokens, seed=step * 100000 + i * 100 + j)
                  for i, j in rows]
        gens = await asyncio.gather(*[engine.generate(prompts[i], sp) for (i, _), sp in zip(rows, params, strict=True)])
        s1 = time.perf_counter()

        ids, attn, mask, logp_rollout, lengths = build_batch([prompts[i] for i, _ in rows], gens, device)
        n = ids.shape[0]
        order = sorted(range(n), key=lambda r: lengths[r])
        micro = [order[k:k + args.micro_rows] for k in range(0, n, args.micro_rows)]
        logp_old = torch.zeros_like(logp_rollout)
        with torch.no_grad(), torch.autocast(device, dtype=torch.bfloat16):
            for mb in micro:
                width = max(lengths[r] for r in mb)
                logp_old[mb, :width - 1] = lp_model(ids[mb, :width], attn[mb, :width]).float()
        synchronize()
        s2 = time.perf_counter()

        rewards = torch.tensor([sum(t % 2 == 0 for t in g.token_ids) / max(len(g.token_ids), 1) for g in gens])
        adv, _ = estimator(AdvantageInputs(rewards=rewards.to(device), action_mask=mask,
                                           group_ids=[str(i) for i, _ in rows], rollout_ids=[f"{i}:{j}" for i, j in rows]))
        num_tokens = mask.sum()
        metrics_acc: dict[str, float] = {}
        for mb in micro:
            width = max(lengths[r] for r in mb)
            with torch.autocast(device, dtype=torch.bfloat16):
                logp = lp_model(ids[mb, :width], attn[mb, :width]).float()
            m = mask[mb, :width - 1]
            loss_tokens, lm = ppo_loss(logp, logp_old[mb, :width - 1], adv[mb, :width - 1], m)
            aggregate(loss_tokens, m, "token-mean", num_tokens=num_tokens).backward()
            for k, v in lm.items():
                metrics_acc[k] = metrics_acc.get(k, 0.0) + float(v) * len(mb) / n
        grad_norm = float(torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0))
        optim.step()
        optim.zero_grad(set_to_none=True)
        synchronize()
        s3 = time.perf_counter()

        moved = await engine.update_weights(bf16_weights())
        s4 = time.perf_counter()
        sync = dict(engine.last_sync)

        stale = await engine.check_weight_update_equal(bf16_weights())
        mismatch = {k: float(v) for k, v in mismatch_metrics(logp_old, logp_rollout, mask).items()}
        gen_tokens = sum(len(g.token_ids) for g in gens)
        train_flops = model_flops(cfg, lengths, matmul_params, passes=3)
        result = {
            "step": step, "sequences": n, "generated_tokens": gen_tokens, "total_tokens": sum(lengths),
            "step_s": s4 - s0, "generation_s": s1 - s0, "logprob_s": s2 - s1, "training_s": s3 - s2,
            "weight_sync_s": s4 - s3, "sync_wait_s": sync["wait_s"], "sync_copy_s": sync["copy_s"],
            "sync_bytes": moved, "sync_buckets": sync["buckets"],
            "generation_tok_per_s": gen_tokens / (s1 - s0),
            "training_tflops": train_flops / (s3 - s2) / 1e12, "training_mfu": train_flops / (s3 - s2) / PEAK_FLOPS,
            "logprob_mfu": model_flops(cfg, lengths, matmul_params, passes=1) / (s2 - s1) / PEAK_FLOPS,
            "stale_after_sync": stale, "grad_norm": grad_norm, "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else 0.0,
            **mismatch, **metrics_acc,
        }
        record(f"grpo_step{step}_{args.tag}", result)
        print(f"step {step}: {result['step_s']:.2f}s = gen {result['generation_s']:.2f} + logprob "
              f"{result['logprob_s']:.2f} + train {result['training_s']:.2f} + sync {result['weight_sync_s']:.3f} "
              f"(wait {sync['wait_s']:.4f}, copy {sync['copy_s']:.4f}); MFU {result['training_mfu']:.1%}; "
              f"stale {len(stale)}; bitwise_frac {mismatch['mismatch/bitwise_frac']:.3f} "
              f"abs_diff {mismatch['mismatch/abs_diff_mean']:.4f} k3 {mismatch['mismatch/k3_kl']:.2e}", flush=True)

    syncs = []
    for _ in range(args.sync_reps):
        weights = bf16_weights()
        synchronize()
        start = time.perf_counter()
        await engine.update_weights(weights)
        syncs.append((time.perf_counter() - start, dict(engine.last_sync)))
    record(f"weight_sync_ipc_{args.tag}", {"total_s": [s for s, _ in syncs], "detail": [d for _, d in syncs]})
    engine.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser()
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
    parser.add_argument("--sync-reps", type=int, default=5)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.35)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
