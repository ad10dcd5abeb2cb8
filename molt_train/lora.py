"""LoRA through PEFT (``--model.lora_dim``, ``--model.lora_alpha``, ``--model.lora_target_modules``).

The adapters are injected into the transformers model in place (``peft.inject_adapter_in_model``), so the module
tree keeps its names (``model.layers.0.self_attn.q_proj`` becomes a LoRA layer over ``...q_proj.base_layer``) and
FSDP2, the log-prob model and the hf engine see the same model class. Only the adapter weights (``lora_A`` /
``lora_B``) train; the trainer sends only them to the hf engine (which carries the same adapters) and exports both
a PEFT adapter directory (``adapter/``: ``PeftModel.from_pretrained(base, adapter)``, vLLM's LoRA requests) and the
merged weights (``hf/``). Targets are glob patterns over full module names (``'*.q_proj'``); none: every linear
layer but the output head.
"""

from __future__ import annotations

import fnmatch
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from molt_train.config.groups import ModelConfig

ADAPTER = "default"  # PEFT's adapter name


def enabled(model_cfg: ModelConfig | None) -> bool:
    return model_cfg is not None and model_cfg.lora_dim > 0


def is_adapter_weight(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


def peft_config(model_cfg: ModelConfig) -> Any:
    """The ``peft.LoraConfig`` of the ``--model.lora_*`` flags."""
    from peft import LoraConfig

    patterns = model_cfg.lora_target_modules
    targets = "|".join(fnmatch.translate(p) for p in patterns) if patterns else "all-linear"
    return LoraConfig(r=model_cfg.lora_dim, lora_alpha=model_cfg.lora_alpha, target_modules=targets, lora_dropout=0.0)


def inject(lm: torch.nn.Module, model_cfg: ModelConfig, adapter_dir: str | Path | None = None) -> torch.nn.Module:
    """Add the adapters to ``lm`` in place (B = 0: the model's outputs are unchanged), freeze everything else, and
    load ``adapter_dir``'s adapter weights if given (a resumed run). Raises ValueError naming the flag when the
    targets match no module."""
    from peft import inject_adapter_in_model

    try:
        inject_adapter_in_model(peft_config(model_cfg), lm, adapter_name=ADAPTER)
    except ValueError as exc:
        raise ValueError(
            f"--model.lora_target_modules {' '.join(model_cfg.lora_target_modules)} matched no linear layer of the "
            f"model ({exc}); patterns are globs over full module names, e.g. '*.q_proj'"
        ) from None
    for name, param in lm.named_parameters():
        param.requires_grad_(is_adapter_weight(name))
    if adapter_dir is not None:
        load_adapter(lm, adapter_dir)
    return lm


def load_adapter(lm: torch.nn.Module, adapter_dir: str | Path) -> None:
    """Copy a PEFT adapter directory's weights into the injected adapters of ``lm``."""
    from peft.utils import set_peft_model_state_dict
    from safetensors.torch import load_file

    weights = load_file(str(Path(adapter_dir) / "adapter_model.safetensors"))
    result = set_peft_model_state_dict(lm, weights, adapter_name=ADAPTER)
    unexpected = getattr(result, "unexpected_keys", [])
    if unexpected:
        raise ValueError(f"{adapter_dir} has adapter weights this model does not: {unexpected[:5]}")


def save(config: Any, weights: dict[str, torch.Tensor], model_cfg: ModelConfig, out: Path, merged: bool = True) -> None:
    """From the full (injected) weights: ``out/adapter`` (PEFT adapter directory) and, with ``merged``, ``out/hf``
    (the merged model)."""
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    model = get_peft_model(AutoModelForCausalLM.from_config(config, dtype=torch.float32), peft_config(model_cfg))
    missing, unexpected = model.base_model.model.load_state_dict(weights, strict=False)
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    if unexpected or set(missing) - tied:
        raise RuntimeError(f"LoRA weights do not match the model: missing {missing}, unexpected {unexpected}")
    model.base_model.model.tie_weights()
    model.save_pretrained(out / "adapter")
    if merged:
        model.merge_and_unload().save_pretrained(out / "hf")
