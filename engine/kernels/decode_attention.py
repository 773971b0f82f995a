"""Decode attention over the filled part of a static KV cache: split-K, one launch.

Each query token t attends to positions [0, L_t) of the cache, L_t = pos_t + 1
read from device memory (T = 1 for a decode step; T > 1 for a chunk of new
tokens after a reused prefix, or a speculative verify step): consecutive
decode graph replays need no host input, and the work grows with the filled
length, not with max_context.

One program per (KV head, split of CHUNK positions, query token). It loads
its K and V tiles at once (one trip to memory, not one per block), then serves
every query head of that KV head (GQA reads K/V once: 1-D dot products for a
single head, an fp32 [16, D] tile for a group), and writes a partial output
with its running max and sum per query head. The
last program of a (KV head, token) to finish, counted by an atomic, merges
the partials and resets the counter: one kernel per layer, graph-safe.
Splits that start past L return at once and are not counted.

Napkin math (Llama-2-7B, L = 600): per layer K+V = 2 * L * kv_heads * head_dim *
2 B = 2 * 600 * 32 * 128 * 2 B = 9.8 MB, ~2.3 µs at 4.28 TB/s; 32 layers add
~0.07 ms per token to the 3.1 ms weight floor. Short contexts are
latency-bound: one launch, one memory round trip for K/V, one for the merge.
The earlier two-kernel version (a program per query head, K then V per 32-row
block) measured ~11 µs per layer at L = 300 on the H200.
"""

from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl


@triton.jit
def _merge_pass(O_PART, ML_PART, rows, g_ok, sp, d, used, m_run, l_run, acc, D: tl.constexpr):
    """Fold splits sp [MERGE_BLOCK] of every head into the running max, sum and output."""
    ok = g_ok[:, None] & (sp < used)[None, :]  # [GM, MB]
    r = rows[:, None] + sp[None, :]
    m_p = tl.load(ML_PART + r * 2, mask=ok, other=float("-inf"), cache_modifier=".cg")
    l_p = tl.load(ML_PART + r * 2 + 1, mask=ok, other=0.0, cache_modifier=".cg")
    o_p = tl.load(
        O_PART + r[:, :, None] * D + d[None, None, :], mask=ok[:, :, None],
        other=0.0, cache_modifier=".cg",
    )  # fmt: skip
    m_new = tl.maximum(m_run, tl.max(m_p, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # padded heads: no NaN
    alpha = tl.exp(m_run - m_safe)
    w = tl.where(ok, tl.exp(m_p - m_safe[:, None]), 0.0)
    l_run = l_run * alpha + tl.sum(w * l_p, axis=1)
    acc = acc * alpha[:, None] + tl.sum(o_p * w[:, :, None], axis=1)
    return m_new, l_run, acc


@triton.jit
def _merge(
    O_PART, ML_PART, OUT, kvh, t, T, used,
    H: tl.constexpr, GROUP: tl.constexpr, D: tl.constexpr,
    SPLITS: tl.constexpr, GM: tl.constexpr, MERGE_BLOCK: tl.constexpr, DYNAMIC: tl.constexpr,
):  # fmt: skip
    """Combine the `used` split partials of every query head of KV head kvh, token t:
    all GROUP heads at once as a [GM, MERGE_BLOCK, D] tile per pass (independent loads,
    one memory round trip per pass rather than one per head)."""
    d = tl.arange(0, D)
    g = tl.arange(0, GM)
    g_ok = g < GROUP
    sb = tl.arange(0, MERGE_BLOCK)
    rows = (t * H + kvh * GROUP + g) * SPLITS  # [GM] first partial row of each head
    m_run = tl.full((GM,), float("-inf"), tl.float32)
    l_run = tl.zeros((GM,), tl.float32)
    acc = tl.zeros((GM, D), tl.float32)
    # On the GPU the loop stops at `used`; the interpreter cannot loop to a loaded value,
    # so there it runs to the static bound, splits past `used` masked.
    if DYNAMIC:
        for s0 in range(0, used, MERGE_BLOCK):
            m_run, l_run, acc = _merge_pass(
                O_PART, ML_PART, rows, g_ok, s0 + sb, d, used, m_run, l_run, acc, D
            )
    else:
        for s0 in range(0, SPLITS, MERGE_BLOCK):
            m_run, l_run, acc = _merge_pass(
                O_PART, ML_PART, rows, g_ok, s0 + sb, d, used, m_run, l_run, acc, D
            )
    h = kvh * GROUP + g
    out = acc / tl.where(g_ok, l_run, 1.0)[:, None]
    tl.store(
        OUT + (h[:, None] * T + t) * D + d[None, :], out.to(OUT.dtype.element_ty),
        mask=g_ok[:, None],
    )  # fmt: skip


@triton.jit
def _decode_attention_kernel(
    Q, K, V, POS, O_PART, ML_PART, LOCK, OUT,
    S, sm_scale,
    H: tl.constexpr, KVH: tl.constexpr, GROUP: tl.constexpr, D: tl.constexpr,
    CHUNK: tl.constexpr, SPLITS: tl.constexpr, MERGE_BLOCK: tl.constexpr,
    GP: tl.constexpr, GM: tl.constexpr, DYNAMIC: tl.constexpr,
):  # fmt: skip
    kvh = tl.program_id(0)
    split = tl.program_id(1)
    t = tl.program_id(2)
    T = tl.num_programs(2)
    length = tl.load(POS + t) + 1
    start = split * CHUNK
    if start < length:
        d = tl.arange(0, D)
        n = start + tl.arange(0, CHUNK)
        n_ok = n < length
        base = kvh * S * D
        kv_offs = base + n[:, None] * D + d[None, :]
        k = tl.load(K + kv_offs, mask=n_ok[:, None], other=0.0)
        v = tl.load(V + kv_offs, mask=n_ok[:, None], other=0.0)
        if GROUP == 1:
            # One query head: 1-D dot products per key (a padded tensor-core tile would
            # be 15/16 waste).
            q = tl.load(Q + (kvh * T + t) * D + d).to(tl.float32) * sm_scale
            s = tl.sum(k.to(tl.float32) * q[None, :], axis=1)
            s = tl.where(n_ok, s, float("-inf"))
            m = tl.max(s, axis=0)
            p = tl.exp(s - m)
            row = (t * H + kvh) * SPLITS + split
            tl.store(O_PART + row * D + d, tl.sum(p[:, None] * v.to(tl.float32), axis=0))
            tl.store(ML_PART + row * 2, m)
            tl.store(ML_PART + row * 2 + 1, tl.sum(p, axis=0))
        else:
            # The group's query heads as one [GP, D] tile against K/V: exact fp32 dot
            # products (FMA, not tensor cores: tiles this small are latency-bound, and
            # P stays in fp32 for the PV product).
            g = tl.arange(0, GP)
            g_ok = g < GROUP
            h = kvh * GROUP + g
            q = tl.load(Q + (h[:, None] * T + t) * D + d[None, :], mask=g_ok[:, None], other=0.0)
            kf = k.to(tl.float32)
            s = tl.dot(q.to(tl.float32), tl.trans(kf), input_precision="ieee")
            s = tl.where(n_ok[None, :], s * sm_scale, float("-inf"))
            m = tl.max(s, axis=1)
            p = tl.exp(s - m[:, None])
            o = tl.dot(p, v.to(tl.float32), input_precision="ieee")
            rows = (t * H + h) * SPLITS + split
            tl.store(O_PART + rows[:, None] * D + d[None, :], o, mask=g_ok[:, None])
            tl.store(ML_PART + rows * 2, m, mask=g_ok)
            tl.store(ML_PART + rows * 2 + 1, tl.sum(p, axis=1), mask=g_ok)
        # Every thread's partial stores happen before the (release) atomic.
        tl.debug_barrier()
        used = (length + CHUNK - 1) // CHUNK
        arrived = tl.atomic_add(LOCK + t * KVH + kvh, 1, sem="acq_rel", scope="gpu")
        if arrived == used - 1:
            _merge(
                O_PART, ML_PART, OUT, kvh, t, T, used, H, GROUP, D, SPLITS, GM, MERGE_BLOCK, DYNAMIC
            )
            tl.atomic_xchg(LOCK + t * KVH + kvh, 0, sem="relaxed", scope="gpu")


class DecodeAttention:
    """Preallocated partial buffers and counters for one model's shape, for up to
    max_queries query tokens at once; graph-safe (positions are read on the device).
    One instance serves every layer (launches on one stream run one after another)."""

    def __init__(
        self,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        max_context: int,
        device: torch.device,
        chunk: int | None = None,
        max_queries: int = 1,
    ) -> None:
        # Few KV heads (GQA): shorter splits, so that more programs share the sequence.
        chunk = chunk or (64 if num_kv_heads >= 8 else 32)
        if head_dim & (head_dim - 1) or chunk & (chunk - 1):
            raise ValueError(
                f"decode attention: head_dim {head_dim} and chunk {chunk} must be powers of two"
            )
        if num_heads % num_kv_heads:
            raise ValueError(f"decode attention: {num_heads} heads over {num_kv_heads} KV heads")
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.group = num_heads // num_kv_heads
        self.chunk = chunk
        self.splits = triton.cdiv(max_context, chunk)
        self.max_queries = max_queries
        rows = max_queries * num_heads * self.splits
        self.o_part = torch.empty((rows, head_dim), dtype=torch.float32, device=device)
        self.ml_part = torch.empty((rows, 2), dtype=torch.float32, device=device)
        # Zero between launches: the merging program resets its counter.
        self.lock = torch.zeros(max_queries * num_kv_heads, dtype=torch.int32, device=device)
        self.sm_scale = 1.0 / math.sqrt(head_dim)
        # The merge reads [GM, MERGE_BLOCK, D] fp32 per pass: ~64 KB across the program.
        self.gm = triton.next_power_of_2(self.group)
        self.merge_block = max(1, min(64 // self.gm, triton.next_power_of_2(self.splits)))
        self.dynamic = os.environ.get("TRITON_INTERPRET") != "1"

    def __call__(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        """q [1, H, T, D] at device positions [T] (query t sees [0, positions[t]]) -> [1, H, T, D]."""
        t = q.shape[2]
        if t > self.max_queries or not q.is_contiguous():
            raise ValueError(
                f"decode attention: q must be contiguous, with at most {self.max_queries} tokens"
            )
        out = torch.empty_like(q)
        _decode_attention_kernel[(self.num_kv_heads, self.splits, t)](
            q, k_cache, v_cache, positions, self.o_part, self.ml_part, self.lock, out,
            k_cache.shape[2], self.sm_scale,
            H=self.num_heads, KVH=self.num_kv_heads, GROUP=self.group, D=self.head_dim,
            CHUNK=self.chunk, SPLITS=self.splits, MERGE_BLOCK=self.merge_block,
            GP=max(16, triton.next_power_of_2(self.group)), GM=self.gm, DYNAMIC=self.dynamic,
            num_warps=4,
        )  # fmt: skip
        return out
