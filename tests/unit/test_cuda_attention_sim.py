"""attention.cu's arithmetic, lane by lane, on the CPU.

The kernel's correctness rests on index math no CPU can run: which lane holds which
element of each ldmatrix / mma / movmatrix fragment, the XOR swizzle of the shared
tiles, which rows each cp.async writes, how blocks and warps split the sequence, the
fresh row at p, the merges. This file replays that math in PyTorch with the address
formulas transcribed from attention.cu and the fragment layouts as the PTX ISA defines
them (m16n8k16: a lane g = lane / 4, t = lane % 4 holds A rows g and g + 8, B column
g, C rows g and g + 8), in float64 except where the kernel rounds (RoPE, P's hi/lo
halves), and compares with the float64 reference of the fused op. A transposed
fragment, a wrong swizzle or an off-by-one split is off by O(1) here; the kernel's
own rounding leaves ~1e-6.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from nib.engine.cuda.attention import TILE, default_splits, plan

LANE = torch.arange(32)
G_, T_ = LANE // 4, LANE % 4
HEADS = 8


def swz(r: torch.Tensor | int, c: torch.Tensor | int, d: int) -> torch.Tensor:
    """Byte offset of 16-byte chunk c of row r in a swizzled [rows][d] tile (swz<D>)."""
    r, c = torch.as_tensor(r), torch.as_tensor(c)
    return r * (d * 2) + ((c ^ (r & 7)) << 4)


def ldmatrix(mem: torch.Tensor, addr: torch.Tensor, trans: bool) -> torch.Tensor:
    """ldmatrix.x4 on a float64 view of shared memory (element i at byte 2i): lane i
    gives the row address of matrix i // 8; returns regs [32 lanes, 4, 2 halves]."""
    rows = torch.stack([mem[int(a) // 2 : int(a) // 2 + 8] for a in addr])  # [32, 8]
    mats = rows.view(4, 8, 8)  # matrix j, row i = lane 8j + i
    out = torch.empty(32, 4, 2, dtype=mem.dtype)
    for j in range(4):
        for e in range(2):
            out[:, j, e] = mats[j, 2 * T_ + e, G_] if trans else mats[j, G_, 2 * T_ + e]
    return out


def mma(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """m16n8k16 from per-lane fragments: a [32, 4, 2], b [32, 2, 2], c [32, 4]."""
    am = torch.zeros(16, 16, dtype=torch.float64)
    bm = torch.zeros(16, 8, dtype=torch.float64)
    cm = torch.zeros(16, 8, dtype=torch.float64)
    for e in range(2):
        am[G_, 2 * T_ + e] = a[:, 0, e]
        am[G_ + 8, 2 * T_ + e] = a[:, 1, e]
        am[G_, 2 * T_ + 8 + e] = a[:, 2, e]
        am[G_ + 8, 2 * T_ + 8 + e] = a[:, 3, e]
        bm[2 * T_ + e, G_] = b[:, 0, e]
        bm[2 * T_ + 8 + e, G_] = b[:, 1, e]
        cm[G_, 2 * T_ + e] = c[:, e]
        cm[G_ + 8, 2 * T_ + e] = c[:, 2 + e]
    dm = am @ bm + cm
    d = torch.empty(32, 4, dtype=torch.float64)
    for e in range(2):
        d[:, e] = dm[G_, 2 * T_ + e]
        d[:, 2 + e] = dm[G_ + 8, 2 * T_ + e]
    return d


def movmatrix(x: torch.Tensor) -> torch.Tensor:
    """movmatrix.m8n8.trans on fragments x [32, 2] (lane: row g, columns 2t, 2t + 1)."""
    m = torch.empty(8, 8, dtype=x.dtype)
    for e in range(2):
        m[G_, 2 * T_ + e] = x[:, e]
    return torch.stack([m[2 * T_, G_], m[2 * T_ + 1, G_]], dim=1)


def shfl_xor(v: torch.Tensor, mask: int) -> torch.Tensor:
    return v[LANE ^ mask]


def rnd(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return x.to(dtype).double()


def rope_chunks(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """rope_chunk for every 8-element chunk c of rows x [n, D]: partner chunk
    (c + CPR/2) % CPR, sign -1 in the first half; the kernel's rounding points."""
    d = x.shape[-1]
    cpr = d // 8
    out = torch.empty_like(x)
    for c in range(cpr):
        pc = (c + cpr // 2) % cpr
        sign = -1.0 if c < cpr // 2 else 1.0
        cols, pcols = slice(8 * c, 8 * c + 8), slice(8 * pc, 8 * pc + 8)
        a = (x[:, cols].float() * cos[cols].float()).to(x.dtype).float()
        b = (x[:, pcols].float() * sign * sin[cols].float()).to(x.dtype).float()
        out[:, cols] = (a + b).to(x.dtype)
    return out


def tile_offsets(d: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    mi, r8 = LANE >> 3, LANE & 7
    koff = [swz(r8 + 8 * (mi & 1), 2 * k + (mi >> 1), d) for k in range(d // 16)]
    voff = [swz(r8 + 8 * (mi >> 1), 2 * k + (mi & 1), d) for k in range(d // 16)]
    return koff, voff


def attend_tile(
    kmem: torch.Tensor,
    vmem: torch.Tensor,
    valid: int,
    qf: list[torch.Tensor],
    state: dict[str, torch.Tensor],
    scale_log2: float,
    d: int,
    dtype: torch.dtype,
) -> None:
    """attend_tile<D> on lane-vectorised state: m, l [32, 2], acc [D/16, 32, 4]."""
    koff, voff = tile_offsets(d)
    s = [torch.zeros(32, 4, dtype=torch.float64) for _ in range(2)]
    for k in range(d // 16):
        a = ldmatrix(kmem, koff[k], trans=False)
        s[k & 1] = mma(a, qf[k], s[k & 1])
    sc = torch.empty(32, 4, dtype=torch.float64)
    for e in range(4):
        row = G_ + 8 * (e >> 1)
        sc[:, e] = torch.where(row < valid, (s[0][:, e] + s[1][:, e]) * scale_log2, -math.inf)
    m, lsum, acc = state["m"], state["l"], state["acc"]
    alpha = torch.empty(32, 2, dtype=torch.float64)
    for h in range(2):
        mx = torch.maximum(sc[:, h], sc[:, 2 + h])
        for mask in (4, 8, 16):
            mx = torch.maximum(mx, shfl_xor(mx, mask))
        mn = torch.maximum(m[:, h], mx)
        assert torch.isfinite(mn).all()
        alpha[:, h] = torch.exp2(m[:, h] - mn)
        m[:, h] = mn
    p = torch.exp2(sc - m[:, [0, 1, 0, 1]])
    lsum[:, 0] = lsum[:, 0] * alpha[:, 0] + (p[:, 0] + p[:, 2])
    lsum[:, 1] = lsum[:, 1] * alpha[:, 1] + (p[:, 1] + p[:, 3])
    acc *= alpha[:, [0, 1, 0, 1]]
    hi = rnd(p, dtype)
    lo = rnd(p - hi, dtype)
    b_hi = torch.stack([movmatrix(hi[:, 0:2]), movmatrix(hi[:, 2:4])], dim=1)  # [32, 2, 2]
    b_lo = torch.stack([movmatrix(lo[:, 0:2]), movmatrix(lo[:, 2:4])], dim=1)
    for j in range(d // 16):
        a = ldmatrix(vmem, voff[j], trans=True)
        acc[j] = mma(a, b_lo, mma(a, b_hi, acc[j]))


def load_tile(
    cache: torch.Tensor, base: int, end: int, p: int, d: int, lane_written: torch.Tensor
) -> torch.Tensor:
    """The shared K (or V) tile after `issue`: every lane's cp.async, row p and rows
    >= end zero-filled. Marks each element written in lane_written (coverage)."""
    cpr, row_bytes = d // 8, d * 2
    rpj = 32 // cpr
    mem = torch.full((TILE * d,), math.nan, dtype=torch.float64)
    for lane in range(32):
        r0, c0 = lane // cpr, lane % cpr
        lane_dst = r0 * row_bytes + ((c0 ^ r0) << 4)
        rel = base + r0
        last = end - 1 - rel
        for j in range(TILE // rpj):
            row = rel + j * rpj
            ok = row < end and row != p
            src_row = rel + min(j * rpj, last)
            assert 0 <= src_row < end  # a valid address even when nothing is read
            dst = (lane_dst + j * rpj * row_bytes) ^ (((j * rpj) & 7) << 4)
            assert dst == int(swz(j * rpj + r0, c0, d))
            e = dst // 2
            lane_written[e : e + 8] += 1
            mem[e : e + 8] = cache[row, 8 * c0 : 8 * c0 + 8] if ok else 0.0
    return mem


def simulate(
    qkv: torch.Tensor,
    p: int,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    heads: int,
    kv_heads: int,
    splits: int,
    warps: int,
) -> torch.Tensor:
    """What the grid computes: out [H, D] in float64 (before the final rounding); writes
    the cache row p as the owner blocks do."""
    d = k_cache.shape[-1]
    group = heads // kv_heads
    dtype = qkv.dtype
    scale_log2 = math.log2(math.e) / math.sqrt(d)
    length = p + 1
    chunk, used = plan(length, splits)
    q, k, v = qkv.reshape(-1).split([heads * d, kv_heads * d, kv_heads * d])
    cos_p, sin_p = cos[p], sin[p]
    out = torch.full((heads, d), math.nan, dtype=torch.float64)
    cpr = d // 8
    for kvh in range(kv_heads):
        # RoPE prologue: Q rows (heads >= G zero) in the swizzled [8][D] tile; fresh k, v.
        qrot = rope_chunks(q.view(heads, d)[kvh * group : (kvh + 1) * group], cos_p, sin_p)
        qmem = torch.zeros(HEADS * d, dtype=torch.float64)
        for r in range(group):
            for c in range(cpr):
                e = int(swz(r, c, d)) // 2
                qmem[e : e + 8] = qrot[r, 8 * c : 8 * c + 8].double()
        fresh_k = rope_chunks(k.view(kv_heads, d)[kvh : kvh + 1], cos_p, sin_p)[0]
        fresh_v = v.view(kv_heads, d)[kvh]
        qf = []
        for kk in range(d // 32):
            regs = ldmatrix(qmem, swz(LANE & 7, 4 * kk + (LANE >> 3), d), trans=False)
            qf += [regs[:, 0:2], regs[:, 2:4]]
        parts = []
        for split in range(splits):
            if split >= used:
                continue
            start = split * chunk
            end = min(start + chunk, length)
            assert start < end
            ntiles = -(-(end - start) // TILE)
            owner = split == used - 1
            assert owner == (start <= p < end)
            if owner:
                k_cache[0, kvh, p] = fresh_k
                v_cache[0, kvh, p] = fresh_v
            kc = k_cache[0, kvh].double()
            vc = v_cache[0, kvh].double()
            wm, wl, wo = [], [], []
            for warp in range(warps):
                mine = (ntiles - 1 - warp) // warps + 1 if warp < ntiles else 0
                state = {
                    "m": torch.full((32, 2), -math.inf, dtype=torch.float64),
                    "l": torch.zeros(32, 2, dtype=torch.float64),
                    "acc": torch.zeros(d // 16, 32, 4, dtype=torch.float64),
                }
                for i in range(mine):
                    base = start + (warp + i * warps) * TILE
                    written = torch.zeros(TILE * d, dtype=torch.int64)
                    kmem = load_tile(kc, base, end, p, d, written)
                    vmem = load_tile(vc, base, end, p, d, torch.zeros_like(written))
                    assert (written == 1).all(), "cp.async must write each element once"
                    fr = p - base
                    if fr < TILE:
                        assert owner and i == mine - 1 and warp == (ntiles - 1) % warps
                        for c in range(cpr):
                            e = int(swz(fr, c, d)) // 2
                            kmem[e : e + 8] = fresh_k[8 * c : 8 * c + 8].double()
                            vmem[e : e + 8] = fresh_v[8 * c : 8 * c + 8].double()
                    attend_tile(kmem, vmem, end - base, qf, state, scale_log2, d, dtype)
                m, lsum, acc = state["m"], state["l"], state["acc"]
                for mask in (4, 8, 16):
                    lsum = lsum + shfl_xor(lsum, mask)
                lanes0 = LANE[G_ == 0]  # t = 0..3 write heads 2t, 2t + 1
                wm.append(torch.stack([m[lanes0, 0], m[lanes0, 1]], 1).reshape(-1))
                wl.append(torch.stack([lsum[lanes0, 0], lsum[lanes0, 1]], 1).reshape(-1))
                o = torch.full((group, d), math.nan, dtype=torch.float64)
                for j in range(d // 16):
                    for e in range(4):
                        h, dim = 2 * T_ + (e & 1), 16 * j + G_ + 8 * (e >> 1)
                        keep = h < group
                        o[h[keep], dim[keep]] = acc[j, keep, e]
                wo.append(o)
            # Block merge over warps (m = -inf for warps without tiles: weight 0).
            wm_t = torch.stack(wm)[:, :group]  # [warps, G]
            wl_t = torch.stack(wl)[:, :group]
            mb = wm_t.max(dim=0).values
            w = torch.exp2(wm_t - mb)
            lb = (w * wl_t).sum(0)
            ob = (w[:, :, None] * torch.stack(wo)).sum(0)
            parts.append((mb, lb, ob))
        if used == 1:
            mb, lb, ob = parts[0]
            out[kvh * group : (kvh + 1) * group] = ob / lb[:, None]
            continue
        # The last block's merge, eight splits per round.
        mt = torch.full((group,), -math.inf, dtype=torch.float64)
        lt = torch.zeros(group, dtype=torch.float64)
        ot = torch.zeros(group, d, dtype=torch.float64)
        for s0 in range(0, used, 8):
            batch = parts[s0 : s0 + 8]
            mn = torch.maximum(mt, torch.stack([b[0] for b in batch]).max(0).values)
            alpha = torch.exp2(mt - mn)
            lt, ot = lt * alpha, ot * alpha[:, None]
            for mb, lb, ob in batch:
                e = torch.exp2(mb - mn)
                lt = lt + e * lb
                ot = ot + e[:, None] * ob
            mt = mn
        out[kvh * group : (kvh + 1) * group] = ot / lt[:, None]
    return out


def reference64(
    qkv: torch.Tensor,
    p: int,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    heads: int,
    kv_heads: int,
) -> torch.Tensor:
    """The fused op in float64 on caches that already hold row p: out [H, D]."""
    d = k_cache.shape[-1]
    q = qkv.reshape(-1)[: heads * d].view(heads, d)
    half = d // 2
    partner = torch.cat((-q[:, half:], q[:, :half]), dim=-1)
    qr = ((q * cos[p]) + (partner * sin[p])).double()  # bf16/fp16 ops: rounded each step
    group = heads // kv_heads
    keys = k_cache[0, :, : p + 1].double().repeat_interleave(group, 0)
    values = v_cache[0, :, : p + 1].double().repeat_interleave(group, 0)
    scores = torch.einsum("hd,hld->hl", qr, keys) / math.sqrt(d)
    return torch.einsum("hl,hld->hd", scores.softmax(-1), values)


CASES = [
    # heads, kv_heads, head_dim, max_context, position, splits, warps, dtype
    (4, 4, 64, 64, 0, 3, 4, torch.bfloat16),  # L = 1: one block, no merge
    (6, 2, 64, 80, 14, 3, 4, torch.float16),  # L = 15
    (6, 2, 64, 80, 15, 3, 4, torch.bfloat16),  # L = 16: the fresh row ends a full tile
    (8, 1, 128, 96, 16, 3, 4, torch.float16),  # L = 17, G = 8
    (7, 1, 64, 200, 150, 5, 4, torch.bfloat16),  # G = 7, tiles spread over the warps
    (12, 2, 128, 72, 70, 2, 8, torch.bfloat16),  # Qwen2.5-1.5B's heads, 8 warps
    (2, 2, 128, 330, 329, 4, 4, torch.float16),  # Llama's G = 1, several tiles per warp
    (3, 1, 64, 300, 100, 12, 4, torch.bfloat16),  # more splits than tiles
    (4, 2, 64, 640, 599, 2, 4, torch.float16),  # ~5 tiles per warp: the online rescale
]


@pytest.mark.parametrize("heads,kv_heads,d,s,p,splits,warps,dtype", CASES)
def test_the_kernels_lane_math_computes_the_fused_op(
    heads: int,
    kv_heads: int,
    d: int,
    s: int,
    p: int,
    splits: int,
    warps: int,
    dtype: torch.dtype,
) -> None:
    gen = torch.Generator().manual_seed(heads * 1000 + p)
    width = (heads + 2 * kv_heads) * d
    qkv = torch.randn(1, 1, width, generator=gen).to(dtype)
    k_cache = torch.randn(1, kv_heads, s, d, generator=gen).to(dtype)
    v_cache = torch.randn(1, kv_heads, s, d, generator=gen).to(dtype)
    angles = torch.rand(s, d // 2, generator=gen) * 6.3
    cos = torch.cat((angles.cos(), angles.cos()), -1).to(dtype)
    sin = torch.cat((angles.sin(), angles.sin()), -1).to(dtype)
    k_sim, v_sim = k_cache.clone(), v_cache.clone()
    got = simulate(qkv, p, cos, sin, k_sim, v_sim, heads, kv_heads, splits, warps)

    from nib.engine.kernels.reference import rope_cache_ref

    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    rope_cache_ref(qkv, torch.tensor([p]), cos, sin, k_ref, v_ref, heads, kv_heads)
    assert torch.equal(k_sim, k_ref) and torch.equal(v_sim, v_ref)  # the row at p, bit for bit
    want = reference64(qkv, p, cos, sin, k_ref, v_ref, heads, kv_heads)
    assert torch.isfinite(got).all()
    err = float((got - want).norm() / want.norm())
    # P's hi/lo halves leave ~2^-17 (bf16) / 2^-22 (fp16) of each weight.
    assert err < 2e-5, err


def test_rope_chunks_match_the_reference_rotation_bit_for_bit() -> None:
    from nib.engine.kernels.reference import rope_cache_ref

    gen = torch.Generator().manual_seed(3)
    for dtype in (torch.bfloat16, torch.float16):
        for d in (64, 128):
            heads, kvh, s = 4, 2, 32
            qkv = torch.randn(1, 1, (heads + 2 * kvh) * d, generator=gen).to(dtype)
            cos = torch.randn(s, d, generator=gen).to(dtype)
            sin = torch.randn(s, d, generator=gen).to(dtype)
            kc, vc = torch.zeros(1, kvh, s, d, dtype=dtype), torch.zeros(1, kvh, s, d, dtype=dtype)
            q = rope_cache_ref(qkv, torch.tensor([5]), cos, sin, kc, vc, heads, kvh)
            mine = rope_chunks(qkv.view(-1)[: heads * d].view(heads, d), cos[5], sin[5])
            assert torch.equal(mine, q.view(heads, d))


def test_splits_cover_the_sequence_and_put_the_new_key_in_the_last_block() -> None:
    for splits in (1, 2, 3, 4, 8, 13, 32, 64):
        for length in [*range(1, 700), 4095, 4096, 4097, 32767, 32768]:
            chunk, used = plan(length, splits)
            assert chunk % TILE == 0 and 1 <= used <= splits
            bounds = [(b * chunk, min((b + 1) * chunk, length)) for b in range(used)]
            assert bounds[0][0] == 0 and bounds[-1][1] == length
            assert all(lo < hi for lo, hi in bounds)  # no used block is empty
            assert all(a[1] == b[0] for a, b in itertools.pairwise(bounds))
            # Short contexts still spread: once every block could have a tile, at least
            # half of them do; at 16 tiles per block, all but a sixteenth.
            if length >= TILE * splits:
                assert 2 * used >= splits
            if length >= 16 * TILE * splits:
                assert used >= splits - splits // 16 - 1
            assert chunk <= -(-length // splits) + TILE - 1


def test_default_splits_keep_the_merge_small_and_fill_the_gpu() -> None:
    assert default_splits(32, 1, 128, 132) == 4  # Llama-2-7B: 128 blocks
    assert default_splits(2, 6, 128, 132) == 8  # Qwen2.5-1.5B: merge reads 8 x 3 KB
    for kvh, group, d in ((8, 4, 128), (2, 3, 64), (1, 8, 128), (64, 1, 64), (48, 1, 128)):
        n = default_splits(kvh, group, d, 132)
        assert n >= 1 and n * group * d * 4 <= 24 << 10
        assert n * kvh <= 132  # one wave
