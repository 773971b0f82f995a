"""SiLU(gate) * up on the fused gate_up projection's output."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _silu_mul_kernel(GU, OUT, stride_gu, stride_o, n, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n
    g = tl.load(GU + row * stride_gu + cols, mask=mask, other=0.0)
    u = tl.load(GU + row * stride_gu + n + cols, mask=mask, other=0.0)
    # Round silu(g) to the activation dtype before the product, as the reference does.
    gf = g.to(tl.float32)
    s = (gf / (1.0 + tl.exp(-gf))).to(g.dtype).to(tl.float32)
    tl.store(
        OUT + row * stride_o + cols, (s * u.to(tl.float32)).to(OUT.dtype.element_ty), mask=mask
    )


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    rows = gate_up.reshape(-1, gate_up.shape[-1])
    n = rows.shape[-1] // 2
    out = torch.empty((rows.shape[0], n), dtype=gate_up.dtype, device=gate_up.device)
    block = 1024
    _silu_mul_kernel[(rows.shape[0], triton.cdiv(n, block))](
        rows, out, rows.stride(0), out.stride(0), n, BLOCK=block, num_warps=4
    )
    return out.view(*gate_up.shape[:-1], n)
