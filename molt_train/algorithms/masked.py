"""Masked reductions over the dense (N, L) token axis.

Every tensor in the trainer is laid out as (rows, positions) with a boolean
``action_mask`` marking the positions the policy generated. Values outside the
mask may be garbage (NaN, inf), so reductions select with ``torch.where``
instead of multiplying by the mask (``NaN * 0`` is still NaN).
"""

from __future__ import annotations

import torch
from torch import Tensor


def masked_mean(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``values`` over positions where ``mask`` is True.

    ``dim=None`` reduces everything to a 0-d tensor; an int reduces that axis.
    A reduction with no selected positions returns 0 instead of NaN.
    """
    selected = torch.where(mask, values, torch.zeros_like(values))
    if dim is None:
        return selected.sum() / mask.sum().clamp(min=1)
    return selected.sum(dim) / mask.sum(dim).clamp(min=1)
