"""GPTQ (Frantar et al., 2022, "GPTQ: Accurate Post-Training Quantization for Generative
Pre-trained Transformers"), for nib's format: symmetric 4-bit, group 128, no act-order.

For a linear layer with inputs X, GPTQ quantises the weight one input column
at a time and spreads each column's rounding error over the columns not yet
quantised, weighted by the inverse Hessian H = 2 X X^T of the layer's
reconstruction error ||W X - Q X||^2. The inverse is taken once, through its
Cholesky factor, and the updates are applied lazily in blocks of 128 columns.
Group scales are chosen from the (already error-corrected) weights when a group
starts, exactly as the reference implementation does. Rows are independent,
so fused q/k/v (or gate/up) matrices quantise the same as their parts.
"""

from __future__ import annotations

import torch

from nib.engine.quant.format import GROUP_SIZE, Int4Weight, check_shape, group_scales

BLOCK = 128


class HessianAccumulator:
    """Running H = 2/n * sum x x^T over the rows x [.., K] a layer sees (fp64 for stability)."""

    def __init__(self, in_features: int, device: torch.device | str = "cpu") -> None:
        self.h = torch.zeros(in_features, in_features, dtype=torch.float64, device=device)
        self.count = 0

    def add(self, x: torch.Tensor) -> None:
        rows = x.detach().reshape(-1, x.shape[-1]).to(self.h.device, torch.float32)
        n = rows.shape[0]
        self.h *= self.count / (self.count + n)
        self.count += n
        # One sample's product in fp32 (fast), summed into fp64 (many samples).
        self.h += (rows.t() @ rows).to(torch.float64) * (2.0 / self.count)


def gptq_quantize(
    w: torch.Tensor, h: torch.Tensor, name: str = "weight", *, damp: float = 0.01
) -> Int4Weight:
    """w [N, K], Hessian h [K, K] -> codes and fp16 scales minimising ||(W - Q) X||."""
    check_shape(name, int(w.shape[0]), int(w.shape[1]))
    w = w.detach().to(torch.float32).clone()
    h = h.to(torch.float64).clone()
    n, k = w.shape
    dead = torch.diag(h) == 0  # inputs never active: any value is exact; pin them to zero
    h[dead, dead] = 1.0
    w[:, dead] = 0.0
    h += torch.eye(k, dtype=h.dtype, device=h.device) * (damp * torch.diag(h).mean())
    # Upper Cholesky factor of H^-1: row i holds the update coefficients for column i.
    hinv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)
    hinv = hinv.to(torch.float32)

    codes = torch.zeros(n, k, dtype=torch.uint8, device=w.device)
    scales = torch.zeros(k // GROUP_SIZE, n, dtype=torch.float16, device=w.device)
    for b0 in range(0, k, BLOCK):
        b1 = min(b0 + BLOCK, k)
        wb = w[:, b0:b1].clone()
        err = torch.zeros_like(wb)
        hb = hinv[b0:b1, b0:b1]
        for i in range(b1 - b0):
            col = b0 + i
            if i == 0:  # BLOCK == GROUP_SIZE: each block is one group
                scales[col // GROUP_SIZE] = group_scales(wb)[0].to(torch.float16)
            s = scales[col // GROUP_SIZE].float()
            q = torch.clamp(torch.round(wb[:, i] / s) + 8, 0, 15)
            codes[:, col] = q.to(torch.uint8)
            e = (wb[:, i] - (q - 8) * s) / hb[i, i]
            wb[:, i:] -= e[:, None] * hb[i, i:][None, :]
            err[:, i] = e
        w[:, b1:] -= err @ hinv[b0:b1, b1:]
    return Int4Weight(codes, scales)
