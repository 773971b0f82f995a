"""RoPE on q and k, and the KV-cache write, in one kernel.

Input is the fused qkv projection's output; q comes out rotated in the
[1, heads, T, head_dim] layout attention wants, while rotated k and v go
straight into the static cache at their positions (read from device memory,
so the decode graph needs no host input).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rope_cache_kernel(
    QKV,
    POS,
    COS,
    SIN,
    Q_OUT,
    K_CACHE,
    V_CACHE,
    stride_t,
    T,
    S,
    H: tl.constexpr,
    KVH: tl.constexpr,
    D: tl.constexpr,
):
    t = tl.program_id(0)
    head = tl.program_id(1)
    half: tl.constexpr = D // 2
    d = tl.arange(0, D)
    partner = (d + half) % D
    sign = tl.where(d < half, -1.0, 1.0)
    pos = tl.load(POS + t)
    cos = tl.load(COS + pos * D + d).to(tl.float32)
    sin = tl.load(SIN + pos * D + d).to(tl.float32)
    row = QKV + t * stride_t
    if head < H:
        src = row + head * D
        x = tl.load(src + d)
        xr = tl.load(src + partner).to(tl.float32) * sign
        # Round each product and the sum to the activation dtype, as the reference does.
        a = (x.to(tl.float32) * cos).to(x.dtype).to(tl.float32)
        b = (xr * sin).to(x.dtype).to(tl.float32)
        tl.store(Q_OUT + (head * T + t) * D + d, (a + b).to(x.dtype))
    else:
        j = head - H
        src = row + H * D + j * D
        x = tl.load(src + d)
        xr = tl.load(src + partner).to(tl.float32) * sign
        a = (x.to(tl.float32) * cos).to(x.dtype).to(tl.float32)
        b = (xr * sin).to(x.dtype).to(tl.float32)
        tl.store(K_CACHE + (j * S + pos) * D + d, (a + b).to(x.dtype))
        v = tl.load(row + (H + KVH) * D + j * D + d)
        tl.store(V_CACHE + (j * S + pos) * D + d, v)


def rope_cache(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    cos_table: torch.Tensor,
    sin_table: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
) -> torch.Tensor:
    d = k_cache.shape[-1]
    if d & (d - 1):
        raise ValueError(f"rope_cache: head_dim {d} must be a power of two")
    t = qkv.shape[1]
    rows = qkv.view(t, qkv.shape[-1])
    if rows.stride(-1) != 1 or not k_cache.is_contiguous() or not v_cache.is_contiguous():
        raise ValueError("rope_cache: qkv rows and both caches must be contiguous")
    q = torch.empty((1, num_heads, t, d), dtype=qkv.dtype, device=qkv.device)
    _rope_cache_kernel[(t, num_heads + num_kv_heads)](
        rows,
        positions,
        cos_table,
        sin_table,
        q,
        k_cache,
        v_cache,
        rows.stride(0),
        t,
        k_cache.shape[2],
        H=num_heads,
        KVH=num_kv_heads,
        D=d,
        num_warps=1,
    )
    return q
