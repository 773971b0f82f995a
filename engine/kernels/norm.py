"""RMSNorm, and the residual add folded into it.

add_rms_norm(x, residual, w): residual += x; return norm(residual) * w — one
pass over the row instead of three kernels (add, norm, scale).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(
    X,
    R,
    W,
    OUT,
    stride_x,
    stride_r,
    stride_o,
    n_cols,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        # The residual stream stays in the activation dtype, as in the reference.
        r = tl.load(R + row * stride_r + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)
        tl.store(R + row * stride_r + cols, x, mask=mask)
    xf = x.to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / n_cols + eps)
    # Arithmetic in fp32, rounded to the activation dtype where the reference rounds
    # (16-bit products are exact in fp32, so this matches native 16-bit math).
    normed = (xf * inv).to(x.dtype).to(tl.float32)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(OUT + row * stride_o + cols, (w * normed).to(OUT.dtype.element_ty), mask=mask)


def _launch(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    rows = x.reshape(-1, x.shape[-1])
    if rows.stride(-1) != 1:
        raise ValueError("rms_norm: the last dimension must be contiguous")
    out = torch.empty_like(rows)
    r = rows if residual is None else residual.view(-1, x.shape[-1])
    n = rows.shape[-1]
    _rms_norm_kernel[(rows.shape[0],)](
        rows,
        r,
        weight,
        out,
        rows.stride(0),
        r.stride(0),
        out.stride(0),
        n,
        eps,
        HAS_RESIDUAL=residual is not None,
        BLOCK=triton.next_power_of_2(n),
        num_warps=4,
    )
    return out.view(x.shape)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return _launch(x, None, weight, eps)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """residual += x (in place); returns rms_norm(residual) * weight."""
    if not residual.is_contiguous():
        raise ValueError("add_rms_norm: residual must be contiguous (it is updated in place)")
    return _launch(x, residual, weight, eps)
