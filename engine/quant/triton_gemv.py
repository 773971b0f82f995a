"""The INT4 GEMV: out [M, N] = x [M, K] @ W.T for small M (decode: M = 1), on CUDA cores.

Napkin math (Llama-2-7B gate_up, 4096 -> 22016, M = 1): the weight is 45.1 MB at
4 bits + 1.4 MB of scales; at the H200's measured 4279 GB/s copy bandwidth that
is 10.9 us. The H200 issues ~33e12 thread-instructions/s, i.e. at most ~4 per
weight at full bandwidth, so the unpacking must stay near 2 per weight: words
are turned into fp16x2 pairs with the 1024.0 trick (triton_dequant.py), each
word meets its 8 activations in 4 fp16x2 FMAs, partial sums go to fp32 per word
and the group scale is applied in fp32.

Each program owns BLOCK_N output rows and walks K in steps of GROUPS x 128
inputs (GROUPS 16-byte loads in flight per row and thread). Optionally SPLIT_K
programs share a row block: each writes an fp32 partial, and the last to finish
(an atomic counter per row block, reset by that program) sums them, so one
launch does the whole product and the kernel stays graph-safe.
"""

from __future__ import annotations

import triton
import triton.language as tl

from nib.engine.quant.triton_dequant import dequant_pairs, dot8


@triton.jit
def _load_x_pair(x32_ptr, rm, m_mask, stride_x32, word, g_mask, J: tl.constexpr):
    """Activation pair J (inputs 2J, 2J+1 of each word) as int32 [BLOCK_M, 1, G, 16]."""
    ptr = x32_ptr + rm[:, None, None, None] * stride_x32 + word[None, :, :, :] * 4 + J
    mask = m_mask[:, None, None, None] & g_mask[None, None, :, None]
    return tl.load(ptr, mask=mask, other=0)


@triton.jit
def gemv_kernel(
    x32_ptr,  # fp16 activations [M, K] viewed as int32 pairs [M, K // 2]
    w_ptr,  # int32 [N, K // 8], layout.py's order
    s_ptr,  # fp16 [K // 128, N]
    b_ptr,  # fp16 [N] or a dummy
    out_ptr,  # fp16 [M, N]
    ws_ptr,  # fp32 workspace [SPLIT_K, M, N] (SPLIT_K > 1)
    lock_ptr,  # int32 counters, one per row block, zero between launches (SPLIT_K > 1)
    M,
    N,
    K,
    stride_x32,
    stride_out,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    GROUPS: tl.constexpr,
    SPLIT_K: tl.constexpr,
    STEPS: tl.constexpr,  # loop steps per split (a constant: known trip counts)
    HAS_BIAS: tl.constexpr,
    USE_ASM: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    n_groups = K // 128
    rm = tl.arange(0, BLOCK_M)
    m_mask = rm < M
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = rn < N
    rg = tl.arange(0, GROUPS)
    rw = tl.arange(0, 16)

    # Split s takes loop steps [s * STEPS, (s + 1) * STEPS); steps past K are masked.
    acc = tl.zeros((BLOCK_M, BLOCK_N, GROUPS, 16), dtype=tl.float32)
    for i in range(0, STEPS):
        g = (pid_k * STEPS + i) * GROUPS + rg  # [G]
        g_mask = g < n_groups
        word = g[:, None] * 16 + rw[None, :]  # [G, 16] word index along K
        wmask = n_mask[:, None, None] & g_mask[None, :, None]
        words = tl.load(
            w_ptr + rn[:, None, None] * (K // 8) + word[None, :, :], mask=wmask, other=0
        )
        scale = tl.load(
            s_ptr + g[None, :] * N + rn[:, None],
            mask=n_mask[:, None] & g_mask[None, :],
            other=0.0,
        )
        p0, p1, p2, p3 = dequant_pairs(words, USE_ASM)
        x0 = _load_x_pair(x32_ptr, rm, m_mask, stride_x32, word[None, :, :], g_mask, 0)
        x1 = _load_x_pair(x32_ptr, rm, m_mask, stride_x32, word[None, :, :], g_mask, 1)
        x2 = _load_x_pair(x32_ptr, rm, m_mask, stride_x32, word[None, :, :], g_mask, 2)
        x3 = _load_x_pair(x32_ptr, rm, m_mask, stride_x32, word[None, :, :], g_mask, 3)
        part = dot8(
            p0[None, :, :, :],
            p1[None, :, :, :],
            p2[None, :, :, :],
            p3[None, :, :, :],
            x0,
            x1,
            x2,
            x3,
            USE_ASM,
        )
        acc += part * scale.to(tl.float32)[None, :, :, None]

    total = tl.sum(tl.sum(acc, axis=3), axis=2)  # [BLOCK_M, BLOCK_N]
    out_mask = m_mask[:, None] & n_mask[None, :]
    out_offs = rm[:, None] * stride_out + rn[None, :]
    if SPLIT_K == 1:
        if HAS_BIAS:
            total += tl.load(b_ptr + rn, mask=n_mask, other=0.0).to(tl.float32)[None, :]
        tl.store(out_ptr + out_offs, total.to(tl.float16), mask=out_mask)
    else:
        split_offs = rm[:, None] * N + rn[None, :]
        tl.store(ws_ptr + pid_k * M * N + split_offs, total, mask=out_mask)
        tl.debug_barrier()
        arrived = tl.atomic_add(lock_ptr + pid_n, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT_K - 1:
            total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for s in range(SPLIT_K):
                total += tl.load(
                    ws_ptr + s * M * N + split_offs, mask=out_mask, other=0.0, cache_modifier=".cg"
                )
            if HAS_BIAS:
                total += tl.load(b_ptr + rn, mask=n_mask, other=0.0).to(tl.float32)[None, :]
            tl.store(out_ptr + out_offs, total.to(tl.float16), mask=out_mask)
            tl.atomic_xchg(lock_ptr + pid_n, 0, sem="relaxed", scope="gpu")
