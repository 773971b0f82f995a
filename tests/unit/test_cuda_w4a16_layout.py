"""The mma16 packing of engine/cuda/w4a16.py, checked on the CPU.

`pack` must put every nibble where w4a16.cu's lanes expect it. These tests run
the kernel's arithmetic in PyTorch, fragment by fragment as the PTX ISA
defines the m16n8k16 layouts (a lane g = lane/4, t = lane%4 holds A rows g and
g + 8, B column g, C rows g and g + 8), with the same bit tricks that turn a
word into fp16 pairs, and compare with the plain dequantised product. A wrong
shift, a swapped half or a wrong input permutation fails here, before any GPU.
"""

from __future__ import annotations

import pytest
import torch

from nib.engine.cuda.w4a16 import CHUNK, TILE, pack, packed_rows, unpack
from nib.engine.quant.format import GROUP_SIZE, QuantShapeError, dequantize


def _random_weight(n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
    scales = (torch.rand(k // GROUP_SIZE, n, generator=g) * 0.02 + 0.001).to(torch.float16)
    return codes, scales


def _u16_to_f16(v: torch.Tensor) -> torch.Tensor:
    v = torch.where(v >= 2**15, v - 2**16, v).to(torch.int16)
    return v.view(torch.float16)


def _dequant8(q: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """w4a16.cu's dequant8 on int64 words: four fp16 pairs (low half, high half)."""
    lo_mask, hi_mask, ex = 0x000F000F, 0x00F000F0, 0x64006400

    def pair(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return _u16_to_f16(w & 0xFFFF), _u16_to_f16((w >> 16) & 0xFFFF)

    out = []
    for shifted in (q, q >> 8):
        lo = pair((shifted & lo_mask) | ex)
        hi = pair((shifted & hi_mask) | ex)
        # sub.rn.f16x2 (x - 1032) and fma.rn.f16x2 (x * 1/16 - 72): exact in fp16 here
        lo = tuple((h.double() - 1032).to(torch.float16) for h in lo)
        hi = tuple((h.double() / 16 - 72).to(torch.float16) for h in hi)
        out += [lo, hi]
    return [out[0], out[1], out[2], out[3]]  # a0: rows g lo, a1: g+8 lo, a2: g hi, a3: g+8 hi


def simulate(x: torch.Tensor, qw: torch.Tensor, sc: torch.Tensor, glu: bool) -> torch.Tensor:
    """What the kernel computes for x [M <= 8, K]: fp32 [M, N] in logical order."""
    m, k = x.shape
    tiles = qw.shape[0]
    n = tiles * TILE
    lanes = torch.arange(32)
    g, t4 = lanes // 4, lanes % 4
    scales = sc.to(torch.int64) & 0xFFFFFFFF  # [tiles, groups, 8]
    y = torch.zeros(m, n, dtype=torch.float64)
    perm = packed_rows(n, glu)
    x16 = x.to(torch.float16)
    for t in range(tiles):
        acc = torch.zeros(16, 8, dtype=torch.float64)
        for grp in range(k // GROUP_SIZE):
            part = torch.zeros(16, 8, dtype=torch.float64)
            for c in (2 * grp, 2 * grp + 1):
                words = qw[t, c].to(torch.int64) & 0xFFFFFFFF  # [32 lanes, 4]
                # Each lane's B fragments: its 16 contiguous activations of this chunk.
                rows = torch.clamp(g, max=m - 1)
                cols = c * CHUNK + 16 * t4[:, None] + torch.arange(16)[None, :]
                xs = x16[rows[:, None], cols]  # [32, 16]
                for j in range(4):
                    a = torch.zeros(16, 16, dtype=torch.float64)
                    b = torch.zeros(16, 8, dtype=torch.float64)
                    regs = _dequant8(words[:, j])
                    for reg, (row_off, col_off) in enumerate(((0, 0), (8, 0), (0, 8), (8, 8))):
                        lo, hi = regs[reg]
                        a[g + row_off, 2 * t4 + col_off] = lo.double()
                        a[g + row_off, 2 * t4 + col_off + 1] = hi.double()
                    b[2 * t4, g] = xs[:, 4 * j].double()
                    b[2 * t4 + 1, g] = xs[:, 4 * j + 1].double()
                    b[2 * t4 + 8, g] = xs[:, 4 * j + 2].double()
                    b[2 * t4 + 9, g] = xs[:, 4 * j + 3].double()
                    part += a @ b
            s = scales[t, grp]  # [8]: (row g, row g + 8)
            s_lo = _u16_to_f16(s & 0xFFFF).double()
            s_hi = _u16_to_f16((s >> 16) & 0xFFFF).double()
            acc += part * torch.cat([s_lo, s_hi])[:, None]
        for rr in range(16):
            y[:, perm[t * TILE + rr]] = acc[rr, :m]
    return y.float()


@pytest.mark.parametrize(("n", "k", "glu"), [(16, 128, False), (32, 256, True), (48, 384, False)])
def test_pack_unpack_roundtrip(n: int, k: int, glu: bool) -> None:
    codes, scales = _random_weight(n, k, seed=n + k)
    qw, sc = pack(codes, scales, glu)
    assert qw.shape == (n // TILE, k // CHUNK, 32, 4) and qw.dtype == torch.int32
    assert sc.shape == (n // TILE, k // GROUP_SIZE, 8) and sc.dtype == torch.int32
    codes2, scales2 = unpack(qw, sc, glu)
    assert torch.equal(codes2, codes)
    assert torch.equal(scales2, scales)


def test_every_nibble_lands_once() -> None:
    """A weight with one code set at a time: the packed words change in exactly one
    nibble, and different inputs land in different places."""
    n, k = 16, 128
    base = torch.zeros(n, k, dtype=torch.uint8)
    scales = torch.ones(k // GROUP_SIZE, n, dtype=torch.float16)
    qw0, _ = pack(base, scales)
    seen = set()
    for row, col in [(0, 0), (0, 1), (8, 0), (3, 17), (15, 127), (7, 64), (9, 100)]:
        w = base.clone()
        w[row, col] = 5
        qw, _ = pack(w, scales)
        diff = (qw.to(torch.int64) ^ qw0.to(torch.int64)).nonzero()
        assert diff.shape[0] == 1
        where = tuple(diff[0].tolist())
        value = (qw.to(torch.int64) & 0xFFFFFFFF)[where]
        shift = int(value).bit_length() - 3  # 5 = 0b101
        seen.add((where, shift))
    assert len(seen) == 7


@pytest.mark.parametrize(
    ("n", "k", "m", "glu"), [(16, 128, 1, False), (32, 256, 3, False), (32, 128, 8, True)]
)
def test_fragment_simulation_matches_dequantised_product(n: int, k: int, m: int, glu: bool) -> None:
    codes, scales = _random_weight(n, k, seed=7 * n + k + m)
    x = (torch.randn(m, k, generator=torch.Generator().manual_seed(m)) * 0.5).to(torch.float16)
    qw, sc = pack(codes, scales, glu)
    got = simulate(x, qw, sc, glu).double()
    ref = x.double() @ dequantize(codes, scales).double().t()
    err = (got - ref).norm() / ref.norm()
    assert err < 1e-6, f"relative error {err:.2e}"


def test_glu_packing_interleaves_gate_and_up() -> None:
    perm = packed_rows(64, glu=True)
    # tile 0: gate channels 0..7 then up channels 0..7 (rows 32..39)
    assert perm[:16].tolist() == [*range(8), *range(32, 40)]
    assert sorted(perm.tolist()) == list(range(64))


@pytest.mark.parametrize(
    ("n", "k", "glu", "rule"),
    [
        (24, 128, False, "multiple of 16"),
        (16, 100, False, "multiple of 128"),
        (48, 128, True, "16"),
    ],
)
def test_shapes_the_kernel_cannot_run_are_refused(n: int, k: int, glu: bool, rule: str) -> None:
    codes = torch.zeros(n, k, dtype=torch.uint8)
    scales = torch.ones(max(1, k // GROUP_SIZE), n, dtype=torch.float16)
    with pytest.raises(QuantShapeError, match=rule) as info:
        pack(codes, scales, glu, name="layers.3.mlp")
    assert "layers.3.mlp" in str(info.value)
