"""``tiny-vl``: a vision-language model built from scratch with transformers' own classes, sized for CPU.

The architecture is LLaVA's (``LlavaForConditionalGeneration``): a CLIP vision tower, a two-layer projector and a
Qwen2 decoder. Its processor is transformers' ``LlavaProcessor`` (a CLIP image processor, the locally trained
tokenizer and a chat template that writes an image part as the ``<image>`` token), saved with the weights, so the
checkpoint loads with ``AutoProcessor`` and ``AutoModelForImageTextToText`` like any hub VLM. The processor expands
each ``<image>`` into one token per vision patch; the model scatters the projected patches into them.

Why LLaVA and not Qwen2-VL: transformers 5's ``Qwen2VLProcessor`` needs a video processor, which needs torchvision,
and PyPI holds no torchvision build for a CPU torch; LLaVA's processor needs only Pillow. Qwen2-VL-family models
(M-RoPE positions from ``image_grid_thw``) are handled by the same code paths (``molt_train.models.multimodal``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from molt_train.models.tiny import CHAT_TEMPLATE, train_tokenizer

IMAGE_TOKEN = "<image>"
# the tiny ChatML template, with content given as parts: an image part is the image token, a text part its text
_CONTENT = (
    "{% macro content(c) %}{% if c is string %}{{ c }}{% else %}{% for part in c %}"
    "{% if part.type == 'image' %}" + IMAGE_TOKEN + "{% elif part.type == 'text' %}{{ part.text }}{% endif %}"
    "{% endfor %}{% endif %}{% endmacro %}"
)
VL_CHAT_TEMPLATE = _CONTENT + CHAT_TEMPLATE.replace("{{ message.content }}", "{{ content(message.content) }}").replace(
    "{{ messages[0].content }}", "{{ content(messages[0].content) }}"
)


def build_tiny_vl(
    texts: Iterable[str],
    out_dir: str | Path,
    *,
    vocab_size: int = 512,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    intermediate_size: int = 0,
    image_size: int = 48,
    patch_size: int = 8,
    vision_hidden_size: int = 64,
    vision_layers: int = 2,
    max_positions: int = 1024,
    seed: int = 0,
) -> Path:
    """Train a tokenizer on ``texts``, build a random tiny VLM and its processor, and save them to ``out_dir``.

    Images are resized and centre-cropped to ``image_size`` pixels square and read as
    ``(image_size / patch_size) ** 2`` patch tokens (36 at the defaults).

    Returns:
        ``out_dir``, a checkpoint loadable with ``AutoProcessor`` and ``AutoModelForImageTextToText``.

    Raises:
        ValueError: ``image_size`` is not a multiple of ``patch_size``.
    """
    if image_size % patch_size:
        raise ValueError(f"image_size={image_size} is not a multiple of patch_size={patch_size}")
    import torch
    from transformers import (
        AutoImageProcessor,
        AutoModelForImageTextToText,
        CLIPVisionConfig,
        LlavaConfig,
        LlavaProcessor,
        Qwen2Config,
    )

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(texts, vocab_size=vocab_size, extra_special_tokens=[IMAGE_TOKEN], split_digits=True)
    tokenizer.chat_template = VL_CHAT_TEMPLATE
    (out / "preprocessor_config.json").write_text(
        json.dumps(
            {
                "image_processor_type": "CLIPImageProcessor",
                "size": {"shortest_edge": image_size},
                "crop_size": {"height": image_size, "width": image_size},
                "image_mean": [0.5, 0.5, 0.5],
                "image_std": [0.5, 0.5, 0.5],
            }
        )
    )
    processor = LlavaProcessor(
        image_processor=AutoImageProcessor.from_pretrained(out),
        tokenizer=tokenizer,
        patch_size=patch_size,
        vision_feature_select_strategy="default",  # the CLS embedding is dropped: one token per patch
        num_additional_image_tokens=1,
        image_token=IMAGE_TOKEN,
        chat_template=VL_CHAT_TEMPLATE,
    )
    text = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 4 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=max(1, num_heads // 2),
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    vision = CLIPVisionConfig(
        hidden_size=vision_hidden_size,
        intermediate_size=2 * vision_hidden_size,
        num_hidden_layers=vision_layers,
        num_attention_heads=max(1, vision_hidden_size // 32),
        image_size=image_size,
        patch_size=patch_size,
    )
    config = LlavaConfig(
        text_config=text,
        vision_config=vision,
        image_token_index=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
        vision_feature_layer=-1,
        vision_feature_select_strategy="default",
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = AutoModelForImageTextToText.from_config(config, dtype=torch.float32)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out)
    processor.save_pretrained(out)
    tokenizer.save_pretrained(out)  # the tokenizer's own chat template too, for text-only readers of the checkpoint
    return out
