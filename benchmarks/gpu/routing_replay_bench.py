"""Routing mismatch between vLLM and the trainer's forward on a tiny random Qwen3-MoE, with and without replaying
vLLM's per-token expert choices (R3, the mechanism behind ``--train.routing_replay``). One GPU:

    python3 benchmarks/gpu/routing_replay_bench.py [--layers 4 --experts 16 --top-k 4 --prompts 64]

vLLM generates with ``enable_return_routed_experts`` (each ``CompletionOutput.routed_experts``: the top-k expert
ids of every forwarded position, ``[positions, layers, k]``). The trainer's forward is transformers'
``Qwen3MoeForCausalLM`` in bf16 on the same checkpoint, over prompt + completion:

- without replay its routers pick their own top-k; ``mismatch_frac`` is the fraction of (position, layer) decisions
  whose expert set differs from vLLM's, and ``logp_abs_diff_mean`` the mean |log p_train - log p_vllm| over the
  completion tokens;
- with replay every router's choice is replaced by vLLM's (its weights recomputed from the trainer's own router
  probabilities at those experts, so gradients still reach the router); ``mismatch_frac`` counts the routers' own
  choices, before the replay (as ``train/routing_mismatch_frac`` does), so the modes differ only through the
  replayed experts of earlier layers, and ``logp_abs_diff_mean`` is the figure that replay changes.

Prints one RESULT line per mode (``shapes.record``; appended to ``$OUT/results.jsonl``). This is the mechanism of
the trainer's ``--train.routing_replay`` (``molt_train/routing.py``: the vllm engine records ``routed_experts``,
``GateReplay`` replays them in the training forward) on a standalone forward; ``--train.record_routing`` reports the
run's ``train/routing_mismatch_frac`` without replaying.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from shapes import random_prompts, record  # noqa: E402

from molt_train.engines.vllm import vllm_routing  # noqa: E402
from molt_train.routing import GateReplay  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
GSM8K = REPO / "molt_envs" / "envs" / "data" / "gsm8k" / "train.jsonl"


def make_moe(out: Path, layers: int, experts: int, top_k: int) -> Path:
    """A random-weight Qwen3-MoE with a tokenizer trained on the gsm8k split, saved to ``out``."""
    from molt_train.models.tiny import build_tiny_moe, save_tiny, train_tokenizer

    rows = [json.loads(line) for line in GSM8K.read_text().splitlines()[:2000]]
    tok = train_tokenizer([r["question"] + " " + r["answer"] for r in rows], vocab_size=1024)
    moe = build_tiny_moe(tok, hidden_size=256, num_layers=layers, num_experts=experts, top_k=top_k, max_positions=2048)
    return save_tiny(moe, tok, out)


def generate(model_dir: Path, prompts: list[list[int]], max_tokens: int, temperature: float) -> list[dict]:
    """vLLM's completions with their sampled log-probs and routed experts."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(
        model=str(model_dir),
        dtype="bfloat16",
        enforce_eager=True,
        gpu_memory_utilization=0.3,
        enable_return_routed_experts=True,
        logprobs_mode="processed_logprobs",
        generation_config="vllm",
        seed=0,
    )
    params = SamplingParams(temperature=temperature, max_tokens=max_tokens, logprobs=0, ignore_eos=True, seed=0)
    outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    results = []
    for prompt, out in zip(prompts, outputs, strict=True):
        done = out.outputs[0]
        ids = list(done.token_ids)
        logps = [position[token].logprob for position, token in zip(done.logprobs, ids, strict=True)]
        # the vllm engine's own conversion: one record of len(prompt) + len(ids) - 1 positions
        routed = vllm_routing(out, len(prompt), len(ids))
        results.append({"prompt": prompt, "ids": ids, "logps": logps, "routed": routed})
    del llm
    torch.cuda.empty_cache()
    return results


def measure(
    model_dir: Path, samples: list[dict], temperature: float, replay: bool, device: str = "cuda"
) -> dict[str, float]:
    """The trainer-side forward of every sample (on ``device``) through the trainer's ``GateReplay``: routing
    mismatch against vLLM's (counted before any replay) and the log-prob gap."""
    from transformers import Qwen3MoeForCausalLM

    model = Qwen3MoeForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).to(device).eval()
    gates = GateReplay(model, replay=replay)
    differ = decisions = 0
    gap, tokens = 0.0, 0
    for s in samples:
        ids = s["prompt"] + s["ids"]
        gates.set(s["routed"][None].to(device))  # one row: a record for each of ids[:-1]
        with torch.no_grad():
            logits = model(torch.tensor([ids[:-1]], device=device)).logits[0].float()
        counts = gates.take()
        differ, decisions = differ + counts[0], decisions + counts[1]
        start = len(s["prompt"]) - 1  # logits[t] predicts ids[t + 1]
        logp = torch.log_softmax(logits / temperature, dim=-1)
        target = torch.tensor(s["ids"], device=device)
        train = logp[start:].gather(-1, target[:, None])[:, 0].cpu()
        gap += float((train - torch.tensor(s["logps"])).abs().sum())
        tokens += len(s["ids"])
    return {
        "replay": replay,
        "mismatch_frac": differ / max(decisions, 1),
        "routing_decisions": decisions,
        "logp_abs_diff_mean": gap / max(tokens, 1),
        "completion_tokens": tokens,
        "routed_shape_first": list(samples[0]["routed"].shape),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--experts", type=int, default=16)
    parser.add_argument("--top-k", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=1.0)
    args = parser.parse_args()
    # the tokenizer is trained here (a thread pool) before vLLM starts its engine core: a forked core hangs in its
    # model load, so spawn it, as the vllm engine does
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = make_moe(Path(tmp) / "moe", args.layers, args.experts, args.top_k)
        prompts = random_prompts(args.prompts, args.prompt_len, vocab=1000)
        samples = generate(model_dir, prompts, args.max_tokens, args.temperature)
        shape = {"layers": args.layers, "experts": args.experts, "top_k": args.top_k, "sequences": len(samples)}
        for replay in (False, True):
            record("routing_replay", shape | measure(model_dir, samples, args.temperature, replay))


if __name__ == "__main__":
    main()
