"""Random-weight models of real shapes for the GPU benchmarks (no weights can be downloaded), and small helpers.

    python3 benchmarks/gpu/shapes.py DIR 0.6b|1.7b|tiny     # writes a bf16 Qwen3 checkpoint + word-level tokenizer

The tokenizer is word-level ("w0".."wN"): the benchmarks pass token ids, so only its special tokens matter
(id 0 = <|endoftext|> = eos). Random weights give a near-uniform next-token distribution, so responses run to
max_tokens: the benchmarks measure speed, not quality.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path

SHAPES = {  # Qwen3 configs (hidden, layers, heads, kv heads, head_dim, intermediate, vocab)
    "0.6b": dict(
        hidden_size=1024,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=3072,
        vocab_size=151936,
    ),
    "1.7b": dict(
        hidden_size=2048,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=6144,
        vocab_size=151936,
    ),
    "tiny": dict(
        hidden_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        intermediate_size=512,
        vocab_size=4096,
    ),
}


CHATML = (
    "{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> {% endfor %}"
    "{% if add_generation_prompt %}<|im_start|> assistant {% endif %}"
)


def make_model(path: str, shape: str, device: str = "cuda") -> str:
    """Write a random bf16 Qwen3 of ``shape`` and its tokenizer to ``path`` (kept if already there)."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    if (Path(path) / "config.json").exists():
        return path
    start = time.time()
    spec = SHAPES[shape]
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    vocab = {s: i for i, s in enumerate(specials)}
    for i in range(spec["vocab_size"] - len(specials)):
        vocab[f"w{i}"] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<|endoftext|>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>", unk_token="<|endoftext|>"
    )
    fast.chat_template = CHATML  # so a registered env's chat prompts render (molt-train rl --env ...)
    fast.save_pretrained(path)
    cfg = Qwen3Config(
        **spec, max_position_embeddings=4096, tie_word_embeddings=True, bos_token_id=0, eos_token_id=0, pad_token_id=0
    )
    cfg.dtype = "bfloat16"
    cfg.architectures = ["Qwen3ForCausalLM"]
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(path)
    params = sum(p.numel() for p in model.parameters())
    print(f"made {path}: Qwen3 {shape}, {params / 1e6:.1f}M params, {time.time() - start:.1f}s", flush=True)
    return path


def random_prompts(n: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(length)] for _ in range(n)]


def record(name: str, result: dict) -> None:
    """Print a RESULT line and append it to ``$OUT/results.jsonl`` (when OUT is set)."""
    line = json.dumps({"name": name, **result}, default=float)
    print(f"RESULT {line}", flush=True)
    out = os.environ.get("OUT")
    if out:
        with open(Path(out, "results.jsonl"), "a") as fh:
            fh.write(line + "\n")


if __name__ == "__main__":
    make_model(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "cuda")
