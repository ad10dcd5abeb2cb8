"""The hf engine with images: on the tiny VLM (LLaVA classes) and on a tiny Qwen2-VL (M-RoPE positions from the
image grids), batched with left padding and shared prefills, every generated token's log-prob is what a plain
teacher-forced forward of the model over the exact ids and image tensors gives; images on a text model are refused."""

from __future__ import annotations

import json

import pytest
import torch
from PIL import Image

from molt_envs import SamplingParams
from molt_envs.envs.shapes import make_row
from molt_envs.vision import VisionInputs, place_images, vision_codec
from molt_train.engines.hf import HFEngine

QWEN_SPECIALS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]


def forced_logprobs(model, ids, gen, **inputs) -> torch.Tensor:
    """Teacher-forced log-probs of ``gen``'s tokens after ``ids`` (one row, no padding, the model's own positions)."""
    full = torch.tensor([ids + gen.token_ids])
    with torch.no_grad():
        logits = model(input_ids=full, **inputs).logits[0].float()
    logp = torch.log_softmax(logits, -1)[len(ids) - 1 : -1]
    return logp.gather(-1, torch.tensor(gen.token_ids)[:, None])[:, 0]


async def test_tiny_vl_generation_matches_a_forced_forward_in_a_mixed_batch(tiny_vl_engine):
    engine, codec = tiny_vl_engine, vision_codec(tiny_vl_engine.processor)
    prompts = []
    for seed, question in ((1, "How many?"), (2, "What colour is the big square in the picture?")):
        messages, images = place_images([{"role": "user", "content": question}], [make_row(seed)["image"]])
        text = engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        prompts.append(codec.encode(text, images))
    text_only = engine.tokenizer.encode("no image here", add_special_tokens=False)
    params = SamplingParams(max_tokens=5, temperature=1.0, seed=3)
    import asyncio

    gens = await asyncio.gather(
        *(engine.generate(ids, params, mm) for ids, mm in prompts + [prompts[0]]), engine.generate(text_only, params)
    )
    for (ids, mm), gen in zip(prompts + [prompts[0]], gens, strict=False):
        forced = forced_logprobs(engine.model, ids, gen, pixel_values=mm.tensors["pixel_values"])
        assert torch.allclose(forced, torch.tensor(gen.log_probs), atol=1e-4)
    assert gens[0].token_ids == gens[2].token_ids  # same prompt, same seed: the shared prefill changes nothing
    assert torch.allclose(forced_logprobs(engine.model, text_only, gens[3]), torch.tensor(gens[3].log_probs), atol=1e-4)


async def test_images_sent_to_a_text_model_are_refused(tiny_engine):
    with pytest.raises(ValueError, match="text-only model"):
        await tiny_engine.generate([1, 2], SamplingParams(max_tokens=1), VisionInputs([Image.new("RGB", (2, 2))]))


@pytest.fixture(scope="module")
def tiny_qwen2_vl(tmp_path_factory):
    """A random Qwen2-VL (M-RoPE) with its Qwen2-VL image processor (the PIL one: no torchvision here)."""
    from transformers import AutoImageProcessor, AutoModelForImageTextToText, Qwen2VLConfig

    from molt_train.models.tiny import train_tokenizer

    tok = train_tokenizer(["how many shapes are there 1 2 3"] * 10, vocab_size=300, extra_special_tokens=QWEN_SPECIALS)
    ids = {t: tok.convert_tokens_to_ids(t) for t in QWEN_SPECIALS}
    config = Qwen2VLConfig(
        text_config=dict(
            vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=1024, tie_word_embeddings=True,
            rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 10000.0},
        ),
        vision_config=dict(depth=2, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2, patch_size=8,
                           spatial_merge_size=2, temporal_patch_size=2, in_channels=3),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(config)
    path = tmp_path_factory.mktemp("qwen2-vl")
    (path / "preprocessor_config.json").write_text(
        json.dumps({"image_processor_type": "Qwen2VLImageProcessor", "patch_size": 8, "merge_size": 2,
                    "temporal_patch_size": 2, "size": {"shortest_edge": 256, "longest_edge": 64 * 64}})
    )  # fmt: skip
    return model, tok, AutoImageProcessor.from_pretrained(path), ids


async def test_qwen2_vl_mrope_positions_in_a_left_padded_batch_match_the_models_own(tiny_qwen2_vl):
    model, tok, image_processor, ids = tiny_qwen2_vl
    engine = HFEngine(model, tok)
    prompts = []
    for size, text in (((64, 48), "how many"), ((32, 32), "how many shapes are there in it")):
        image = Image.new("RGB", size, (200, 30, 30))
        pixels = image_processor(images=[image], return_tensors="pt")
        n = int(pixels["image_grid_thw"].prod()) // 4
        ids_ = [ids["<|vision_start|>"], *[ids["<|image_pad|>"]] * n, ids["<|vision_end|>"]]
        ids_ += tok.encode(text, add_special_tokens=False)
        mm = VisionInputs([image], dict(pixels), ids["<|image_pad|>"], [n])
        prompts.append((ids_, mm))
    params = SamplingParams(max_tokens=4, temperature=1.0, seed=5)
    import asyncio

    gens = await asyncio.gather(*(engine.generate(p, params, mm) for p, mm in prompts))
    assert prompts[0][1].tensors["image_grid_thw"].tolist() != prompts[1][1].tensors["image_grid_thw"].tolist()
    for (prompt, mm), gen in zip(prompts, gens, strict=True):
        full = torch.tensor([prompt + gen.token_ids])
        types = (full == ids["<|image_pad|>"]).int()  # what the model's processor would return with the ids
        forced = forced_logprobs(model, prompt, gen, mm_token_type_ids=types, **mm.tensors)
        assert torch.allclose(forced, torch.tensor(gen.log_probs), atol=1e-4)
