"""gemv16.cu's index math, simulated on the CPU step by step as the kernel runs it.

`simulate` mirrors the kernel body (engine/cuda/gemv16.cu) with the 32 lanes as a
vector: the blocks and warps of the launch geometry gemv16.py computes, each
warp's row groups, the U-deep ring of load buffers with its prologue and
refills, the predicated loads past the K slice, the staged activations (with
their two-half layout and zero padding), the per-group split-K partials and the
counter that elects the last arrival, and the epilogues. Buffers are tagged
with what was loaded so a rotation bug fails loudly; the staged activations
start as NaN so a read of an unwritten slot poisons the result; every output
row must be written exactly once. The sums are float64, so they must equal
W x to rounding, and the outputs must equal gemv16.reference.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from nib.engine.cuda.gemv16 import (
    GLU,
    PLAIN,
    SCRATCH,
    Gemv16Config,
    candidates,
    geometry,
    kernel_name,
    reference,
    shape_rule,
)

LANES = torch.arange(32)


def _rnd(v: torch.Tensor | float, dt: torch.dtype) -> torch.Tensor:
    return torch.as_tensor(v, dtype=torch.float64).to(dt).double()


class _Sim:
    """One launch's state: the output, the split-K workspace and counters, bookkeeping."""

    def __init__(
        self,
        cfg: Gemv16Config,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        glu: bool,
        residual: torch.Tensor | None,
    ) -> None:
        self.cfg, self.glu, self.dt = cfg, glu, weight.dtype
        self.w = weight.double()
        self.n = self.w.shape[0] // 2 if glu else self.w.shape[0]
        self.k = self.w.shape[1]
        self.geo = geometry(self.n, self.k, cfg)
        self.rows_per_warp = 2 * cfg.rows if glu else cfg.rows
        self.bias, self.residual = bias, residual
        n = self.n
        y = residual.reshape(-1).clone() if residual is not None else torch.full((n,), float("nan"))
        self.y = y.to(self.dt)
        self.written = torch.zeros(n, dtype=torch.int64)
        self.sums = torch.full((2, n), float("nan"), dtype=torch.float64)
        self.ws = torch.full((self.geo.splits * 2 * n,), float("nan"), dtype=torch.float64)
        self.counters = torch.zeros(self.geo.groups, dtype=torch.int64)
        self.loaded = torch.zeros(self.w.shape, dtype=torch.int64)

    def store_row(self, j: int, v: float, up: float) -> None:
        """gemv16.cu's store_row."""
        dt = self.dt
        self.sums[0, j], self.sums[1, j] = v, up
        self.written[j] += 1
        if self.glu:
            g, u = _rnd(v, dt), _rnd(up, dt)
            self.y[j] = (_rnd(g / (1 + torch.exp(-g)), dt) * u).to(dt)
            return
        if self.bias is not None:
            v = v + float(self.bias[j].double())
        if self.residual is not None:
            v = float(self.y[j].double()) + float(_rnd(v, dt))
        self.y[j] = torch.tensor(v, dtype=torch.float64).to(dt)


def _stage(
    x: torch.Tensor, nw: torch.Tensor | None, k: int, k0: int, chunks: int, half: int, eps: float
) -> tuple[torch.Tensor, float]:
    """The block's staged slice (NaN where nothing was written) and 1/rms."""
    xs = torch.full((2 * half, 4), float("nan"), dtype=torch.float64)
    c0 = k0 // 8
    lo_c, hi_c = (0, k // 8) if nw is not None else (c0, c0 + chunks)
    ss = 0.0
    for c in range(lo_c, hi_c):
        h = x[8 * c : 8 * c + 8].clone()
        if nw is not None:
            ss += float((h * h).sum())
            h = h * nw[8 * c : 8 * c + 8]
        j = c - c0
        if 0 <= j < chunks:
            xs[j], xs[half + j] = h[:4], h[4:]
    xs[chunks:half] = 0.0
    xs[half + chunks :] = 0.0
    return xs, 1.0 if nw is None else 1.0 / (ss / k + eps) ** 0.5


class _Warp:
    """One warp of gemv16_body: its row groups, the load cursor and the buffer ring."""

    def __init__(self, sim: _Sim, wg: int, gstride: int, split: int, xs: torch.Tensor) -> None:
        self.sim, self.wg, self.gstride, self.split, self.xs = sim, wg, gstride, split, xs
        geo, u = sim.geo, sim.cfg.unroll
        self.k0 = split * geo.k_split
        self.chunks = (min(sim.k, self.k0 + geo.k_split) - self.k0) // 8
        self.n_it = -(-self.chunks // (32 * u)) * u
        self.half = self.n_it * 32
        groups, per_warp = geo.groups, sim.cfg.per_warp
        self.n_t = min(per_warp, (groups - 1 - wg) // gstride + 1) if wg < groups else 0
        self.total = self.n_t * self.n_it
        self.lt = self.li = 0
        self.rows: list[int] = []
        self.real: list[bool] = []

    def set_rows(self, t: int) -> None:
        sim, r_ = self.sim, self.sim.cfg.rows
        j0 = (self.wg + t * self.gstride) * r_
        self.rows, self.real = [], []
        for r in range(sim.rows_per_warp):
            want = j0 + (r % r_ if sim.glu else r)
            j = min(want, sim.n - 1)  # past n: the last row again, never stored
            self.rows.append(sim.n + j if sim.glu and r >= r_ else j)
            self.real.append(want < sim.n)

    def load(self) -> tuple[tuple[int, int], list[torch.Tensor]]:
        c = self.li * 32 + LANES
        ok = c < self.chunks
        cols = torch.where(ok[:, None], self.k0 + c[:, None] * 8 + torch.arange(8)[None, :], 0)
        vals = []
        for row, real in zip(self.rows, self.real, strict=True):
            vals.append(torch.where(ok[:, None], self.sim.w[row][cols], 0.0))
            if real:
                self.sim.loaded[row, cols[ok].reshape(-1)] += 1
        tag = (self.lt, self.li)
        self.li += 1
        if self.li == self.n_it:
            self.li = 0
            self.lt += 1
            if self.lt < self.n_t:
                self.set_rows(self.lt)
        return tag, vals

    def run(self, inv: float) -> None:
        sim, u = self.sim, self.sim.cfg.unroll
        if self.total > 0:
            self.set_rows(0)
        buf: list[tuple[tuple[int, int], list[torch.Tensor]] | None] = [None] * u
        for p in range(u):
            if p < self.total:
                buf[p] = self.load()
        acc = torch.zeros(sim.rows_per_warp, 2, 32, dtype=torch.float64)
        for t in range(self.n_t):
            for q0 in range(0, self.n_it, u):
                for p in range(u):
                    entry = buf[p]
                    assert entry is not None and entry[0] == (t, q0 + p), (entry, t, q0 + p)
                    c = (q0 + p) * 32 + LANES
                    assert int(c.max()) < self.half
                    xa, xb = self.xs[c], self.xs[self.half + c]
                    for r, v in enumerate(entry[1]):
                        acc[r, 0] += (v[:, :4] * xa).sum(-1)
                        acc[r, 1] += (v[:, 4:] * xb).sum(-1)
                    if t * self.n_it + q0 + p + u < self.total:
                        buf[p] = self.load()
            self.finish(t, acc.sum(dim=(1, 2)), inv)
            acc.zero_()

    def finish(self, t: int, s: torch.Tensor, inv: float) -> None:
        sim, r_, n = self.sim, self.sim.cfg.rows, self.sim.n
        splits, split = sim.geo.splits, self.split
        g = self.wg + t * self.gstride
        j0 = g * r_
        if splits == 1:
            for r in range(r_):
                if j0 + r < n:
                    up = float(s[r_ + r]) * inv if sim.glu else 0.0
                    sim.store_row(j0 + r, float(s[r]) * inv, up)
            return
        for r in range(r_):
            j = j0 + r
            if j < n:
                sim.ws[2 * split * n + j] = s[r]
                if sim.glu:
                    sim.ws[(2 * split + 1) * n + j] = s[r_ + r]
        sim.counters[g] += 1
        if sim.counters[g] - 1 != splits - 1:
            return
        for r in range(r_):
            j = j0 + r
            if j < n:
                v = sum(float(sim.ws[2 * sp * n + j]) for sp in range(splits))
                up = 0.0
                if sim.glu:
                    up = sum(float(sim.ws[(2 * sp + 1) * n + j]) for sp in range(splits))
                sim.store_row(j, v * inv, up * inv)
        sim.counters[g] = 0


def simulate(
    cfg: Gemv16Config,
    weight: torch.Tensor,
    x: torch.Tensor,
    bias: torch.Tensor | None = None,
    norm_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    glu: bool = False,
    residual: torch.Tensor | None = None,
    split_order: list[int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y in the weight's dtype, the fp64 sums per output row [plain/gate, up], how many
    times each weight was loaded for a stored row). Blocks run one after another, splits in split_order."""
    sim = _Sim(cfg, weight, bias, glu, residual)
    geo = sim.geo
    grid_x, splits = geo.grid
    xd = x.reshape(-1).double()
    nw = None if norm_weight is None else norm_weight.reshape(-1).double()
    for split in split_order if split_order is not None else range(splits):
        probe = _Warp(sim, 0, 1, split, torch.empty(0))
        assert SCRATCH + 2 * probe.half * 16 <= geo.shared, "the slice exceeds shared memory"
        for bx in range(grid_x):
            xs, inv = _stage(xd, nw, sim.k, probe.k0, probe.chunks, probe.half, eps)
            for warp in range(cfg.warps):
                _Warp(sim, bx * cfg.warps + warp, grid_x * cfg.warps, split, xs).run(inv)
    assert (sim.written == 1).all(), f"rows written {sim.written.tolist()}"
    assert (sim.counters == 0).all(), "a split-K counter was left set"
    return sim.y, sim.sums, sim.loaded


def _inputs(n_rows: int, k: int, dt: torch.dtype, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(n_rows, k, generator=g) / k**0.5).to(dt)
    x = (torch.randn(k, generator=g) * 2).to(dt)
    nw = (1 + 0.1 * torch.randn(k, generator=g)).to(dt)
    b = torch.randn(n_rows, generator=g).to(dt)
    res = torch.randn(n_rows, generator=g).to(dt)
    return w, x, nw, b, res


CASES = [
    # (n output rows, k, config, glu)
    (37, 264, Gemv16Config(2, 4, 4), False),  # a partial row group and a partial chunk stride
    (5, 8, Gemv16Config(1, 4, 8), False),  # one chunk: 31 lanes masked, 7 strides padded
    (64, 1032, Gemv16Config(4, 4, 4, per_warp=2), False),
    (29, 520, Gemv16Config(1, 8, 8, per_warp=3), False),  # groups do not divide evenly
    (40, 2056, Gemv16Config(2, 4, 4, split_k=4), False),
    (13, 520, Gemv16Config(1, 4, 8, split_k=4), False),  # k_split rounds: 3 splits hold inputs
    (33, 776, Gemv16Config(2, 8, 4, per_warp=2, split_k=2), False),
    (21, 264, Gemv16Config(1, 4, 4), True),
    (18, 1032, Gemv16Config(2, 4, 4, per_warp=2), True),
    (11, 2056, Gemv16Config(1, 8, 8, split_k=8), True),
]


@pytest.mark.parametrize(("n", "k", "cfg", "glu"), CASES)
@pytest.mark.parametrize("dt", [torch.bfloat16, torch.float16])
def test_simulated_kernel_sums_every_weight_once(
    n: int, k: int, cfg: Gemv16Config, glu: bool, dt: torch.dtype
) -> None:
    rows = 2 * n if glu else n
    w, x, nw, _, _ = _inputs(rows, k, dt, seed=n * 1000 + k)
    for norm in (False, True):
        geo = geometry(n, k, cfg)
        order = list(range(geo.splits))[::-1]  # the last split arrives first
        y, sums, loaded = simulate(
            cfg, w, x, None, nw if norm else None, glu=glu, split_order=order
        )
        assert (loaded == 1).all(), "a weight was loaded twice or never"
        xin = x.double() * (nw.double() if norm else 1)
        exact = w.double() @ xin
        if norm:
            exact = exact / (x.double().pow(2).mean() + 1e-6).sqrt()
        got = torch.cat([sums[0], sums[1]]) if glu else sums[0]
        assert torch.allclose(got, exact, rtol=1e-9, atol=1e-9)
        ref = reference(x, w, None, nw if norm else None, glu=glu)
        assert torch.equal(y, ref) or float((y.double() - ref.double()).abs().max()) < 1e-2


@pytest.mark.parametrize(("n", "k", "cfg"), [(c[0], c[1], c[2]) for c in CASES if not c[3]])
def test_simulated_epilogues_match_the_reference(n: int, k: int, cfg: Gemv16Config) -> None:
    dt = torch.bfloat16
    w, x, _, b, res = _inputs(n, k, dt, seed=n + k)
    y, _, _ = simulate(cfg, w, x, bias=b)
    ref = reference(x, w, bias=b)
    assert float((y.double() - ref.double()).abs().max()) <= 2**-7 * float(ref.abs().max())
    y, _, _ = simulate(cfg, w, x, bias=b, residual=res)
    ref = reference(x, w, bias=b, residual=res)
    assert float((y.double() - ref.double()).abs().max()) <= 2**-7 * float(ref.abs().max())


def test_reference_rounds_where_the_triton_kernel_rounds() -> None:
    """GLU: round(round(silu(round(gate))) * round(up)); residual: round(r + round(y))."""
    w = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.bfloat16)
    x = torch.tensor([1.0078125, 3.0], dtype=torch.bfloat16)  # 1 + 2^-7: a bf16 value
    out = reference(x, w, glu=True)
    g = torch.tensor(1.0078125, dtype=torch.float64)
    expect = (g / (1 + torch.exp(-g))).to(torch.bfloat16).double() * 3.0
    assert out.dtype == torch.bfloat16 and float(out[0]) == float(expect.to(torch.bfloat16))
    # y = 1.0078125 + 2^-9 rounds to 1.0078125 first; then 1 + that rounds to 2 (ties to
    # even), where one rounding of 1 + y would give 2.015625.
    w = torch.tensor([[1.0, 1.0]], dtype=torch.bfloat16)
    x = torch.tensor([1.0078125, 2**-9], dtype=torch.bfloat16)
    out = reference(x, w, residual=torch.tensor([1.0], dtype=torch.bfloat16))
    assert float(out[0]) == 2.0


def test_geometry_covers_k_with_whole_strides_per_split() -> None:
    for k, s in itertools.product((8, 264, 1536, 4096, 8960, 11008), (1, 2, 3, 4, 8)):
        geo = geometry(100, k, Gemv16Config(split_k=s))
        assert geo.splits <= s and (geo.splits - 1) * geo.k_split < k <= geo.splits * geo.k_split
        if geo.splits > 1:
            assert geo.k_split % 256 == 0
        assert geo.shared <= 227 * 1024


def test_candidates_name_only_instantiated_kernels() -> None:
    for (n, k), glu in itertools.product(
        [(12288, 4096), (4096, 4096), (11008, 4096), (4096, 11008), (32000, 4096),
         (2048, 1536), (1536, 1536), (8960, 1536), (1536, 8960), (151936, 1536)],
        (False, True),
    ):  # fmt: skip
        cands = candidates(n, k, glu)
        assert cands and len(set(cands)) == len(cands)
        for cfg in cands:
            kernel_name(cfg, torch.bfloat16, glu)  # raises for a missing instantiation
            assert (cfg.rows, cfg.warps, cfg.unroll) in (GLU if glu else PLAIN)
    assert any(c.split_k > 1 for c in candidates(1536, 8960, False))
    assert any(c.per_warp > 1 for c in candidates(151936, 1536, False))
    with pytest.raises(ValueError, match="no GLU kernel"):
        kernel_name(Gemv16Config(4, 4, 4), torch.bfloat16, glu=True)


def test_labels_name_the_config() -> None:
    assert Gemv16Config(2, 4, 4).label() == "cuda gemv16 r2w4u4"
    assert Gemv16Config(1, 8, 8, per_warp=2, split_k=4).label() == "cuda gemv16 r1w8u8t2s4"


@pytest.mark.parametrize(
    ("n", "k", "stride", "dtype", "glu", "rule"),
    [
        (64, 100, 100, torch.bfloat16, False, "multiple of 8"),
        (64, 4096, 4100, torch.float16, False, "row stride"),
        (64, 4096, 4096, torch.float32, False, "bf16 or fp16"),
        (63, 4096, 4096, torch.bfloat16, True, "two equal halves"),
        (64, 65536, 65536, torch.bfloat16, False, "up to"),
    ],
)
def test_shapes_the_kernel_cannot_run_are_named(
    n: int, k: int, stride: int, dtype: torch.dtype, glu: bool, rule: str
) -> None:
    assert rule in shape_rule(n, k, stride, dtype, glu)
    assert shape_rule(n, 4096, 4096, torch.bfloat16, False) == ""
