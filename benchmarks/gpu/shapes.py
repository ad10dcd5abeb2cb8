"""Random-weight models of real shapes for the GPU benchmarks (no weights can be downloaded), and small helpers.

    python3 benchmarks/gpu/shapes.py DIR 0.6b|1.7b|tiny     # writes a bf16 Qwen3 checkpoint + word-level tokenizer
    python3 benchmarks/gpu/shapes.py DIR vl-3b|vl-tiny      # a bf16 Qwen2.5-VL (3B shape or tiny) + its processor

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


VL_SHAPES = {  # Qwen2.5-VL configs: the text decoder, the vision tower (window attention, full attention blocks)
    "vl-3b": dict(
        text=dict(hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
                  num_key_value_heads=2, mrope_section=[16, 24, 24]),
        vision=dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=2048,
                    fullatt_block_indexes=[7, 15, 23, 31]),
        vocab_size=151936,
    ),
    "vl-tiny": dict(
        text=dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, mrope_section=[8, 12, 12]),
        vision=dict(depth=2, hidden_size=128, intermediate_size=256, num_heads=2, out_hidden_size=256,
                    fullatt_block_indexes=[1]),
        vocab_size=4096,
    ),
}  # fmt: skip
VL_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
               "<|video_pad|>"]  # fmt: skip
# ChatML with Qwen2-VL's image parts, words separated by spaces for the word-level tokenizer
VL_CHATML = (
    "{% for m in messages %}<|im_start|> {{ m['role'] }} {% if m['content'] is string %}{{ m['content'] }} "
    "{% else %}{% for c in m['content'] %}{% if c['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|> "
    "{% elif c['type'] == 'text' %}{{ c['text'] }} {% endif %}{% endfor %}{% endif %}<|im_end|> {% endfor %}"
    "{% if add_generation_prompt %}<|im_start|> assistant {% endif %}"
)


def make_vl_model(path: str, shape: str, device: str = "cuda") -> str:
    """Write a random bf16 Qwen2.5-VL of ``shape``, a word-level tokenizer (the shapes env's words first, then
    "w0".."wN"; eos ``<|im_end|>``) and its ``Qwen2_5_VLProcessor`` to ``path`` (kept if already there).

    Needs torchvision (transformers' Qwen2-VL video processor does); loads with ``AutoProcessor`` and vLLM."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import (
        AutoProcessor,
        PreTrainedTokenizerFast,
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
    )

    from molt_envs.envs.shapes import COLOURS, KINDS

    if (Path(path) / "made.json").exists():
        return path
    start = time.time()
    spec = VL_SHAPES[shape]
    words = ["user", "assistant", "system", "How", "many", "shapes", "are", "there?", "What", "colour", "is", "the",
             "Are", "there", "more", "circles", "or", "squares?", "squares", *COLOURS, *(f"{k}?" for k in KINDS),
             *map(str, range(10))]  # fmt: skip
    vocab = {s: i for i, s in enumerate(VL_SPECIALS)}
    for word in dict.fromkeys(words):
        vocab.setdefault(word, len(vocab))
    for i in range(spec["vocab_size"] - len(vocab)):
        vocab[f"w{i}"] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<|endoftext|>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", unk_token="<|endoftext|>",
        additional_special_tokens=VL_SPECIALS[1:],
    )  # fmt: skip
    fast.chat_template = VL_CHATML
    ids = {t: vocab[t] for t in VL_SPECIALS}
    text, vision = dict(spec["text"]), dict(spec["vision"])
    mrope = text.pop("mrope_section")
    config = Qwen2_5_VLConfig(
        text_config=dict(
            **text, vocab_size=spec["vocab_size"], max_position_embeddings=4096, tie_word_embeddings=True,
            rope_parameters={"rope_type": "default", "mrope_section": mrope, "rope_theta": 1000000.0},
            eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"], bos_token_id=None,
        ),
        vision_config=dict(**vision, patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=112,
                           in_channels=3, hidden_act="silu"),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True, eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"],
    )  # fmt: skip
    config.dtype = "bfloat16"
    config.architectures = ["Qwen2_5_VLForConditionalGeneration"]
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2_5_VLForConditionalGeneration(config).to(torch.bfloat16)
    model.generation_config.eos_token_id = ids["<|im_end|>"]
    out = Path(path)
    model.save_pretrained(out)
    fast.save_pretrained(out)
    image = {"patch_size": 14, "merge_size": 2, "temporal_patch_size": 2, "size": {"shortest_edge": 56 * 56,
             "longest_edge": 28 * 28 * 1280}, "image_mean": [0.48145466, 0.4578275, 0.40821073],
             "image_std": [0.26862954, 0.26130258, 0.27577711]}  # fmt: skip
    (out / "preprocessor_config.json").write_text(
        json.dumps({"image_processor_type": "Qwen2VLImageProcessor", **image})
    )
    (out / "video_preprocessor_config.json").write_text(
        json.dumps({"video_processor_type": "Qwen2VLVideoProcessor", **image})
    )
    (out / "processor_config.json").write_text(json.dumps({"processor_class": "Qwen2_5_VLProcessor"}))
    (out / "chat_template.jinja").write_text(VL_CHATML)
    AutoProcessor.from_pretrained(out).save_pretrained(out)  # the processor as transformers writes it
    params = sum(p.numel() for p in model.parameters())
    (out / "made.json").write_text(json.dumps({"shape": shape, "params": params}))
    print(f"made {path}: Qwen2.5-VL {shape}, {params / 1e6:.1f}M params, {time.time() - start:.1f}s", flush=True)
    del model  # the caller goes on to start vLLM and a trainer on this GPU: 16 GB cached here made them run out
    if device == "cuda":
        torch.cuda.empty_cache()
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
    make = make_vl_model if sys.argv[2].startswith("vl-") else make_model
    make(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "cuda")
