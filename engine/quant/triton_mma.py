"""The INT4 matmul on tensor cores: out [M, N] = x [M, K] @ W.T for M from 2 to prefill sizes.

Each program owns a BLOCK_M x BLOCK_N tile of the output and walks K one
group (128 inputs) at a time: it loads 16 words per weight row, unpacks them
to fp16 (c - 8) with the 1024.0 trick (exact), multiplies on the tensor cores
with fp32 accumulation, and applies the group's scales to the fp32 partial
product -- BLOCK_M x BLOCK_N multiplies per group instead of one per weight.

For M <= 16 (speculative verification, small batches) BLOCK_M = 16 keeps the
weight read once: napkin math for Llama-2-7B gate_up is 46.5 MB -> 10.9 us at
4279 GB/s, while the tensor-core work (16 x 4096 x 22016 x 2 = 2.9 GFLOP) is
~3 us at a fraction of the H200's ~990 dense fp16 TFLOP/s. For prefill the
same kernel runs with larger tiles, or kernels.py dequantises to fp16 and calls
cuBLAS. SPLIT_K works as in triton_gemv.py (last program reduces).
"""

from __future__ import annotations

import triton
import triton.language as tl

from nib.engine.quant.triton_dequant import unpack_tile


@triton.jit
def mma_kernel(
    x_ptr,  # fp16 [M, K]
    w_ptr,  # int32 [N, K // 8], layout.py's order
    s_ptr,  # fp16 [K // 128, N]
    b_ptr,  # fp16 [N] or a dummy
    out_ptr,  # fp16 [M, N]
    ws_ptr,  # fp32 workspace [SPLIT_K, M, N] (SPLIT_K > 1)
    lock_ptr,  # int32 counters, one per output tile, zero between launches (SPLIT_K > 1)
    M,
    N,
    K,
    stride_x,
    stride_out,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLIT_K: tl.constexpr,
    STEPS: tl.constexpr,  # loop steps per split (a constant: known trip counts)
    HAS_BIAS: tl.constexpr,
    USE_ASM: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)
    n_groups = K // 128
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_mask = rm < M
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = rn < N
    rk = tl.arange(0, 128)
    rw = tl.arange(0, 16)

    # Split s takes groups [s * STEPS, (s + 1) * STEPS); groups past K are masked.
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for i in range(0, STEPS):
        g = pid_k * STEPS + i
        g_ok = g < n_groups
        x = tl.load(
            x_ptr + rm[:, None] * stride_x + g * 128 + rk[None, :],
            mask=m_mask[:, None] & g_ok,
            other=0.0,
        )
        words = tl.load(
            w_ptr + rn[:, None] * (K // 8) + g * 16 + rw[None, :],
            mask=n_mask[:, None] & g_ok,
            other=0,
        )
        scale = tl.load(s_ptr + g * N + rn, mask=n_mask & g_ok, other=0.0)
        codes = unpack_tile(words, BLOCK_N, 16, USE_ASM)  # [BLOCK_N, 128] fp16, c - 8
        part = tl.dot(x, tl.trans(codes), out_dtype=tl.float32)
        acc += part * scale.to(tl.float32)[None, :]

    out_mask = m_mask[:, None] & n_mask[None, :]
    out_offs = rm[:, None] * stride_out + rn[None, :]
    if SPLIT_K == 1:
        if HAS_BIAS:
            acc += tl.load(b_ptr + rn, mask=n_mask, other=0.0).to(tl.float32)[None, :]
        tl.store(out_ptr + out_offs, acc.to(tl.float16), mask=out_mask)
    else:
        tile = pid_m * tl.num_programs(0) + pid_n
        split_offs = rm[:, None] * N + rn[None, :]
        tl.store(ws_ptr + pid_k * M * N + split_offs, acc, mask=out_mask)
        tl.debug_barrier()
        arrived = tl.atomic_add(lock_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT_K - 1:
            total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for s in range(SPLIT_K):
                total += tl.load(
                    ws_ptr + s * M * N + split_offs, mask=out_mask, other=0.0, cache_modifier=".cg"
                )
            if HAS_BIAS:
                total += tl.load(b_ptr + rn, mask=n_mask, other=0.0).to(tl.float32)[None, :]
            tl.store(out_ptr + out_offs, total.to(tl.float16), mask=out_mask)
            tl.atomic_xchg(lock_ptr + tile, 0, sem="relaxed", scope="gpu")
