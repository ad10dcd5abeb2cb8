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
  probabilities at those experts, so gradients still reach the router), which makes ``mismatch_frac`` 0 by
  construction and leaves ``logp_abs_diff_mean`` as the figure that replay changes.

Prints one RESULT line per mode (``shapes.record``; appended to ``$OUT/results.jsonl``). The trainer's
``--train.routing_replay`` flag is not built: this measures what it would replay.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from shapes import random_prompts, record  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
GSM8K = REPO / "molt_envs" / "envs" / "data" / "gsm8k" / "train.jsonl"


def make_moe(out: Path, layers: int, experts: int, top_k: int) -> Path:
    """A random-weight Qwen3-MoE with a tokenizer trained on the gsm8k split, saved to ``out``."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    from molt_train.models.tiny import save_tiny, train_tokenizer

    rows = [json.loads(line) for line in GSM8K.read_text().splitlines()[:2000]]
    tok = train_tokenizer([r["question"] + " " + r["answer"] for r in rows], vocab_size=1024)
    config = Qwen3MoeConfig(
        vocab_size=len(tok),
        hidden_size=256,
        intermediate_size=512,
        moe_intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        num_experts=experts,
        num_experts_per_tok=top_k,
        max_position_embeddings=2048,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    return save_tiny(Qwen3MoeForCausalLM(config), tok, out)


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
        if done.routed_experts is None:
            raise RuntimeError(
                "vLLM returned no routed_experts although enable_return_routed_experts=True: this build does not "
                "capture MoE routing for Qwen3-MoE"
            )
        ids = list(done.token_ids)
        logps = [position[token].logprob for position, token in zip(done.logprobs, ids, strict=True)]
        results.append({"prompt": prompt, "ids": ids, "logps": logps, "routed": done.routed_experts})
    del llm
    torch.cuda.empty_cache()
    return results


def measure(
    model_dir: Path, samples: list[dict], temperature: float, replay: bool, device: str = "cuda"
) -> dict[str, float]:
    """The trainer-side forward of every sample (on ``device``): routing mismatch against vLLM's and the log-prob
    gap."""
    import torch.nn.functional as F
    from transformers import Qwen3MoeForCausalLM

    model = Qwen3MoeForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).to(device).eval()
    gates = [layer.mlp.gate for layer in model.model.layers]
    chosen: list[torch.Tensor] = []
    forced: dict[int, torch.Tensor] = {}

    def replayed(gate: torch.nn.Module, index: int):
        def forward(hidden_states: torch.Tensor):
            logits = F.linear(hidden_states.reshape(-1, gate.hidden_dim), gate.weight)
            probs = torch.softmax(logits, dtype=torch.float, dim=-1)
            idx = forced[index][: probs.shape[0]].to(probs.device)
            top = probs.gather(-1, idx)
            if gate.norm_topk_prob:
                top = top / top.sum(dim=-1, keepdim=True)
            return logits, top.to(logits.dtype), idx

        return forward

    for i, gate in enumerate(gates):
        gate.register_forward_hook(lambda _m, _in, out: chosen.append(out[2].detach()))
        if replay:
            gate.forward = replayed(gate, i)
    differ = decisions = 0
    gap, tokens = 0.0, 0
    for s in samples:
        ids = s["prompt"] + s["ids"]
        routed = torch.as_tensor(s["routed"]).long()  # [positions, layers, k]
        positions = min(len(ids) - 1, routed.shape[0])
        for i in range(len(gates)):
            forced[i] = routed[:positions, i]
        chosen.clear()
        with torch.no_grad():
            logits = model(torch.tensor([ids[:positions]], device=device)).logits[0].float()
        for layer, picked in enumerate(chosen):
            mine = picked[:positions].sort(dim=-1).values.cpu()
            theirs = routed[:positions, layer].sort(dim=-1).values
            differ += int((mine != theirs).any(dim=-1).sum())
            decisions += positions
        start = len(s["prompt"]) - 1  # logits[t] predicts ids[t + 1]
        logp = torch.log_softmax(logits / temperature, dim=-1)
        n = min(len(s["ids"]), positions - start)
        target = torch.tensor(s["ids"][:n], device=device)
        train = logp[start : start + n].gather(-1, target[:, None])[:, 0].cpu()
        gap += float((train - torch.tensor(s["logps"][:n])).abs().sum())
        tokens += n
    return {
        "replay": replay,
        "mismatch_frac": differ / max(decisions, 1),
        "routing_decisions": decisions,
        "logp_abs_diff_mean": gap / max(tokens, 1),
        "completion_tokens": tokens,
        "routed_shape_first": list(torch.as_tensor(samples[0]["routed"]).shape),
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
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = make_moe(Path(tmp) / "moe", args.layers, args.experts, args.top_k)
        prompts = random_prompts(args.prompts, args.prompt_len, vocab=1000)
        samples = generate(model_dir, prompts, args.max_tokens, args.temperature)
        shape = {"layers": args.layers, "experts": args.experts, "top_k": args.top_k, "sequences": len(samples)}
        for replay in (False, True):
            record("routing_replay", shape | measure(model_dir, samples, args.temperature, replay))


if __name__ == "__main__":
    main()
