# NOTE FROM THE LEAD (learning recipe measured in a single-process prototype, 2 shared cores, 07:00 UTC):
# molt/arith-v1 (its manifest now sets max_operand=20), digit-split tokenizer
# (train_tokenizer(..., vocab_size=300, split_digits=True)), build_tiny_model(hidden_size=64, num_layers=2,
# num_heads=4, num_kv_heads=2, intermediate_size=256). SFT: batch 128, AdamW lr 3e-3, 400 steps, assistant-only loss
# -> held-out greedy accuracy 0.418. RL: GRPO, 32 prompts x 8 samples, temperature 1.0, max 6 new tokens, AdamW lr
# 3e-4 betas (0.9, 0.99), one on-policy update per batch, 150 steps -> held-out accuracy 0.724 (+30.6 points).
# lr 1e-3 for RL collapsed (0.42 -> 0.24). SFT ~85 s, RL ~105 s in that prototype under contention.
"""The embedded-default demo: a tiny model built from scratch runs GSM8K episodes through the hf engine.

Nothing is downloaded: the tokenizer is trained on GSM8K text in a second and the model is randomly initialised, so
rewards are ~0. This shows the plumbing end to end: registry -> runner -> engine -> graded Trajectory.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Sequence

import env_registry
from molt_envs import SamplingParams
from molt_train.engines.hf import HFEngine
from molt_train.models.tiny import build_tiny_model, train_tokenizer


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="molt-train demo")
    parser.add_argument("--env", default="molt/gsm8k-v1")
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--max_new_tokens", type=int, default=48)
    args = parser.parse_args(argv)
    return asyncio.run(_run(args))


async def _run(args: argparse.Namespace) -> int:
    spec = env_registry.spec(args.env)
    rows = env_registry.load_split(spec, "test", args.episodes)
    corpus = [r["prompt"][-1]["content"] + " " + str(r["label"]) for r in env_registry.load_split(spec, "train", 2000)]
    tokenizer = train_tokenizer(corpus, vocab_size=1024)
    engine = HFEngine(build_tiny_model(tokenizer), tokenizer)
    runner = env_registry.runner_for(args.env)
    params = SamplingParams(temperature=1.0, max_tokens=args.max_new_tokens, seed=0)
    start = time.perf_counter()
    trajs = await asyncio.gather(*[runner.execute(r["prompt"], r["label"], params.updated(seed=i), 1024, tokenizer,
                                                  engine) for i, r in enumerate(rows)])
    for i, t in enumerate(trajs):
        print(f"episode {i}: reward={t.reward:.1f} tokens={len(t.token_ids)} actions={t.num_action_tokens} "
              f"info={t.info} failure={t.failure}")
    print(f"{len(trajs)} episodes of {spec.id} (spec {spec.hash}) in {time.perf_counter() - start:.2f}s, "
          f"mean reward {sum(t.reward for t in trajs) / len(trajs):.3f}, engine {engine.stats}")
    return 0
