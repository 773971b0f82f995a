"""The INT4 matmul in plain PyTorch: unpack, dequantise, multiply. Runs anywhere.

This is the specification the GPU kernels are tested against, and what the
engine runs on the CPU. It dequantises the whole weight on every call, which
is fine for tests and small CPU models and exactly what the kernels avoid.
"""

from __future__ import annotations

import torch

from nib.engine.quant.format import dequantize
from nib.engine.quant.layout import unpack


def dequantize_packed(qweight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """qweight int32 [N, K/8] (kernel layout), scales fp16 [K/128, N] -> fp32 [N, K]."""
    return dequantize(unpack(qweight), scales)


def int4_linear_reference(
    x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """x [..., K] -> [..., N] in x's dtype, with the products and sums in fp32."""
    w = dequantize_packed(qweight, scales)
    out = x.to(torch.float32) @ w.t()
    if bias is not None:
        out = out + bias.to(torch.float32)
    return out.to(x.dtype)
