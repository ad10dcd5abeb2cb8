"""What the hf engine and the trainer need to know about a vision-language model, and nothing model-specific more.

- ``load_model`` / ``model_class``: a checkpoint whose config has a ``vision_config`` loads with
  ``AutoModelForImageTextToText`` (its processor with ``AutoProcessor``), any other with ``AutoModelForCausalLM``.
- ``position_ids``: a model with multimodal rotary positions (Qwen2-VL's and Qwen2.5-VL's M-RoPE) gets the 3-D
  positions its own ``get_rope_index`` computes from the image grids (left or right padding both); any other model
  the usual positions from the attention mask. The engine's decode steps continue from the last position
  (``positions[..., -1:] + 1``: a context always ends in text, where the three M-RoPE axes agree).
- ``layers_to_shard``: the decoder layers, and the vision tower's blocks, which FSDP2 shards one by one.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn


def is_vision_config(config: Any) -> bool:
    return getattr(config, "vision_config", None) is not None


def model_class(config: Any) -> Any:
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    return AutoModelForImageTextToText if is_vision_config(config) else AutoModelForCausalLM


def load_model(path: str | Path, **kwargs: Any) -> nn.Module:
    """The model of an HF checkpoint directory, with the auto class its config calls for."""
    from transformers import AutoConfig

    return model_class(AutoConfig.from_pretrained(path)).from_pretrained(path, **kwargs)


def load_processor(path: str | Path) -> Any:
    """The checkpoint's ``AutoProcessor`` when it ships an image processor (``preprocessor_config.json``, or a
    ``processor_config.json`` holding it: what transformers 5 writes), else its tokenizer."""
    from transformers import AutoProcessor, AutoTokenizer

    if any((Path(path) / name).is_file() for name in ("preprocessor_config.json", "processor_config.json")):
        return AutoProcessor.from_pretrained(path)
    return AutoTokenizer.from_pretrained(path)


def placeholder_ids(processor: Any) -> frozenset[int]:
    """The image/video placeholder token ids of a VLM's processor (its ``image_token`` / ``video_token``); none for
    a text tokenizer."""
    tokenizer = getattr(processor, "tokenizer", None)
    if tokenizer is None:
        return frozenset()
    tokens = [getattr(processor, name, None) for name in ("image_token", "video_token")]
    return frozenset(tokenizer.convert_tokens_to_ids(t) for t in tokens if isinstance(t, str))


def _backbone(model: nn.Module) -> nn.Module:
    """The module holding ``get_rope_index`` (``model.model`` of a ``*ForConditionalGeneration``)."""
    inner = getattr(model, "model", None)
    return inner if inner is not None and hasattr(inner, "get_rope_index") else model


def uses_mrope(model: nn.Module) -> bool:
    return hasattr(_backbone(model), "get_rope_index")


def position_ids(model: nn.Module, input_ids: Tensor, attention_mask: Tensor, tensors: dict[str, Tensor]) -> Tensor:
    """(N, L) positions, or (3, N, L) for an M-RoPE model (computed by the model from its image grids)."""
    if not uses_mrope(model):
        return (attention_mask.cumsum(-1) - 1).clamp(min=0)
    backbone = _backbone(model)
    config = model.config
    accepted = inspect.signature(backbone.get_rope_index).parameters
    kwargs: dict[str, Any] = {"attention_mask": attention_mask}
    for name in ("image_grid_thw", "video_grid_thw", "second_per_grid_ts"):
        if name in accepted and name in tensors:
            kwargs[name] = tensors[name]
    if "mm_token_type_ids" in accepted:  # transformers >= 5.2x: which tokens are image (1) or video (2) placeholders
        types = torch.zeros_like(input_ids, dtype=torch.int)
        types[input_ids == config.image_token_id] = 1
        if getattr(config, "video_token_id", None) is not None:
            types[input_ids == config.video_token_id] = 2
        kwargs["mm_token_type_ids"] = types
    positions, _ = backbone.get_rope_index(input_ids, **kwargs)
    # padding: keep the positions of the rows' real tokens, zeros elsewhere (as the text path does)
    return positions * attention_mask[None].to(positions.dtype)


def select_rows(positions: Tensor, rows: Tensor) -> Tensor:
    """Rows of (N, L) or (3, N, L) positions."""
    return positions[rows] if positions.dim() == 2 else positions[:, rows]


def layers_to_shard(model: nn.Module) -> list[nn.Module]:
    """Decoder layers (``model.model.layers`` or ``model.model.language_model.layers``) and the vision tower's
    blocks (Qwen-VL's ``visual.blocks``, CLIP/SigLIP's ``encoder.layers``), each its own FSDP2 unit."""
    inner = model.model
    text = getattr(inner, "language_model", inner)
    layers = list(text.layers)
    tower = (
        getattr(inner, "visual", None) or getattr(inner, "vision_tower", None) or getattr(inner, "vision_model", None)
    )
    if tower is not None:
        blocks = getattr(tower, "blocks", None)
        if blocks is None:
            encoder = getattr(getattr(tower, "vision_model", tower), "encoder", None)
            blocks = getattr(encoder, "layers", None) or []
        layers += list(blocks)
    return layers
