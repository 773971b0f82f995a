"""Round-to-nearest quantisation into nib's INT4 format (used at load time for 16-bit checkpoints)."""

from __future__ import annotations

import torch

from nib.engine.quant.format import Int4Weight, check_shape, group_scales, quantize_with_scales


def rtn_quantize(w: torch.Tensor, name: str = "weight") -> Int4Weight:
    """w [N, K] -> symmetric group-128 codes with fp16 scales (GPTQ's quantiser with no Hessian)."""
    check_shape(name, int(w.shape[0]), int(w.shape[1]))
    scales = group_scales(w).to(torch.float16)
    return Int4Weight(quantize_with_scales(w, scales), scales)
