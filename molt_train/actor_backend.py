"""``--actor.backend``: which library builds the policy model the trainer shards and trains.

- ``hf`` (default): transformers' ``AutoModelForCausalLM`` (CPU or GPU), or ``AutoModelForImageTextToText`` for a
  vision-language checkpoint (``molt_train.models.multimodal``).
- ``automodel``: NVIDIA NeMo AutoModel's ``NeMoAutoModelForCausalLM`` (its own implementations of supported
  architectures, e.g. Qwen3, built on the meta device; the result is still an ``nn.Module`` with HF parameter
  names, so FSDP2 sharding, log-probs and weight sync work unchanged). Needs CUDA and the ``nemo_automodel``
  package; without them the error says what to install.

``--actor.freeze_moe_router`` takes the MoE router (gate) weights out of training: they keep their checkpoint
values, so the trainer and vLLM route alike by construction. It refuses a model that has no router.
"""

from __future__ import annotations

import re
from typing import Any

import torch

BACKENDS = ("hf", "automodel")
AUTOMODEL_INSTALL_HINT = (
    "--actor.backend automodel needs NVIDIA NeMo AutoModel and a CUDA GPU: pip install "
    "nemo-automodel==0.7.0 (with transformers>=5.18, torchao); or use --actor.backend hf"
)
# router weights of MoE blocks: Qwen3-MoE/Mixtral `mlp.gate.weight`, AutoModel/DeepSeek `.gate.weight`/`router`
ROUTER_PATTERN = re.compile(r"(^|\.)(gate|router)\.(weight|bias|e_score_correction_bias)$")


def load_policy_model(
    backend: str,
    model_path: str,
    *,
    dtype: torch.dtype = torch.float32,
    attn_implementation: str = "sdpa",
    freeze_moe_router: bool = False,
) -> Any:
    """The policy model of ``backend`` from an HF checkpoint directory."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown --actor.backend {backend!r}; choose one of {BACKENDS}")
    if backend == "hf":
        from molt_train.models.multimodal import load_model

        model = load_model(model_path, dtype=dtype, attn_implementation=attn_implementation)
    else:
        try:
            from nemo_automodel import NeMoAutoModelForCausalLM
        except ImportError as exc:
            raise ImportError(f"{AUTOMODEL_INSTALL_HINT} (import failed: {exc})") from exc
        if not torch.cuda.is_available():
            raise RuntimeError(f"{AUTOMODEL_INSTALL_HINT} (no CUDA device is visible)")
        model = NeMoAutoModelForCausalLM.from_pretrained(
            model_path, dtype=dtype, attn_implementation=attn_implementation, use_liger_kernel=False
        )
    if freeze_moe_router:
        freeze_router(model)
    return model


def freeze_router(model: torch.nn.Module) -> list[str]:
    """Stop gradients into every MoE router parameter; returns their names."""
    frozen = [name for name, param in model.named_parameters() if ROUTER_PATTERN.search(name)]
    if not frozen:
        raise ValueError(
            "--actor.freeze_moe_router: the model has no MoE router parameters (no '*.gate.weight' or "
            "'*.router.*'); drop the flag for a dense model"
        )
    params = dict(model.named_parameters())
    for name in frozen:
        params[name].requires_grad_(False)
    return frozen
