"""INT4 x 16-bit on the tensor cores (w4a16.cu): the mma16 packing, its checks, the launches.

`pack()` is the one place where nibbles are put in the order the kernel reads
(see the comment at the top of w4a16.cu): per 16-row tile and 64-input chunk,
each lane's m16n8k16 A fragments for four k-steps in one 16-byte word, and one
fp16x2 of scales per lane and group. `unpack()` inverts it exactly. Both are
plain PyTorch, so the CPU tests check the layout on every run.

`CudaInt4` holds one layer's packed weight and runs it:
- 1 row (decode): the kernel with the activations staged in shared memory,
  optionally with the RMSNorm before it, the residual add after it, or
  SiLU(gate) * up (a "glu" packing interleaves gate and up channels per tile);
- 2..16 rows (speculative verification, small batches): the same kernel reading
  fp16 activations from global memory;
- more rows (prefill): dequantise to fp16 with w4_dequant, then cuBLAS.
Tile shapes per call are `W4Config`s, chosen by timing at start-up (tune.py).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from nib.engine.quant.format import GROUP_SIZE, QuantShapeError

TILE = 16  # output rows per tile (the mma's M)
CHUNK = 64  # inputs per 16-byte word of a lane
MAX_ROWS = 16  # the kernel's n8 tiles cover at most 16 activation rows
MAX_K_STAGED = 24 * 1024  # one row staged in shared memory as fp16 (48 KB)
EPI_PLAIN, EPI_RESIDUAL, EPI_GLU, EPI_GLU_PLAIN = 0, 1, 2, 3
# (nibble shift of row g, row g + 8) for the four inputs 4j + e of word j.
_SHIFTS = ((0, 16, 8, 24), (4, 20, 12, 28))


def check_shape(name: str, n: int, k: int, glu: bool) -> None:
    """The rules of the mma16 packing, named in the error."""
    if k % GROUP_SIZE:
        raise QuantShapeError(f"{name}: in_features {k} is not a multiple of {GROUP_SIZE}")
    if n % TILE:
        raise QuantShapeError(
            f"{name}: out_features {n} is not a multiple of {TILE} (rule: the INT4 "
            f"tensor-core kernel computes {TILE}-row tiles)"
        )
    if glu and n % (2 * TILE):
        raise QuantShapeError(
            f"{name}: a fused gate/up of {n} rows needs an intermediate size that is a "
            "multiple of 16 (rule: each tile holds 8 gate and 8 up channels)"
        )


def packed_rows(n: int, glu: bool, device: torch.device | None = None) -> torch.Tensor:
    """perm[p] = the logical row at packed row p (p = 16 * tile + tile row)."""
    p = torch.arange(n, device=device)
    if not glu:
        return p
    t, rr = p // TILE, p % TILE
    return torch.where(rr < 8, t * 8 + rr, n // 2 + t * 8 + rr - 8)


def _shift_table(device: torch.device) -> torch.Tensor:
    return torch.tensor(_SHIFTS, dtype=torch.int64, device=device).view(1, 1, 1, 1, 1, 2, 4)


def pack(
    codes: torch.Tensor, scales: torch.Tensor, glu: bool = False, name: str = "weight"
) -> tuple[torch.Tensor, torch.Tensor]:
    """codes uint8 [N, K] (0..15), scales [K/128, N] -> (qw int32 [N/16, K/64, 32, 4],
    sc int32 [N/16, K/128, 8]) in the kernel's order (on the codes' device)."""
    n, k = codes.shape
    check_shape(name, n, k, glu)
    device = codes.device
    perm = packed_rows(n, glu, device)
    tiles, chunks, groups = n // TILE, k // CHUNK, k // GROUP_SIZE
    shifts = _shift_table(device)
    qw = torch.empty((tiles, chunks, 32, 4), dtype=torch.int32, device=device)
    step = max(1, (1 << 24) // max(k, 1))  # tiles per slice: bounded int64 scratch
    for t0 in range(0, tiles, step):
        t1 = min(tiles, t0 + step)
        c = codes[perm[t0 * TILE : t1 * TILE]].to(torch.int64)
        # rows (tile, h, g), inputs (chunk, t4, j, e) -> (tile, chunk, g, t4, j, h, e)
        c = c.view(t1 - t0, 2, 8, chunks, 4, 4, 4).permute(0, 3, 2, 4, 5, 1, 6)
        words = (c << shifts).sum(dim=(-1, -2)).reshape(t1 - t0, chunks, 32, 4)
        qw[t0:t1] = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    s = scales.to(torch.float16)[:, perm].reshape(groups, tiles, 2, 8).permute(1, 0, 3, 2)
    sc = s.contiguous().view(torch.int32).view(tiles, groups, 8)
    return qw, sc


def unpack(
    qw: torch.Tensor, sc: torch.Tensor, glu: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """The inverse of pack: (codes uint8 [N, K], scales fp16 [K/128, N]) in logical order."""
    tiles, chunks = qw.shape[0], qw.shape[1]
    n, k = tiles * TILE, chunks * CHUNK
    words = qw.to(torch.int64) & 0xFFFFFFFF
    shifts = _shift_table(qw.device)
    nib = (words.view(tiles, chunks, 8, 4, 4, 1, 1) >> shifts) & 0xF  # t, c, g, t4, j, h, e
    packed = nib.permute(0, 5, 2, 1, 3, 4, 6).reshape(n, k).to(torch.uint8)
    perm = packed_rows(n, glu, qw.device)
    codes = torch.empty_like(packed)
    codes[perm] = packed
    groups = k // GROUP_SIZE
    s = sc.contiguous().view(torch.float16).view(tiles, groups, 8, 2).permute(1, 0, 3, 2)
    s = s.reshape(groups, n)
    scales = torch.empty_like(s)
    scales[:, perm] = s
    return codes, scales


@dataclass(frozen=True)
class W4Config:
    """One launch shape: `r` 16-row tiles per block, `warps` warps sharing the block's K
    slice, `pf` groups of 128 inputs in flight per warp (register pipeline) or stages of
    `warps` groups (bulk), `splits` blocks along K; `bulk`: weights stream into shared
    memory through the copy engine (sm_90) instead of through registers; `xpf` (2..16
    rows only): each warp loads its next group's activations before this group's
    products (the `x` twins of the `g` kernels)."""

    r: int = 1
    warps: int = 4
    pf: int = 4
    splits: int = 1
    bulk: bool = False
    cluster: bool = False  # the splits merge in a thread-block cluster (sm_90)
    xpf: bool = False  # activations one group ahead (multi-row kernels)

    def label(self) -> str:
        split = f"s{self.splits}" if self.splits > 1 else ""
        ahead = " xpf" if self.xpf else ""
        if self.bulk:
            return f"int4 mma16 bulk r{self.r}w{self.warps}n{self.pf}{split}{ahead}"
        tail = "c" if self.cluster else ""
        return f"int4 mma16 r{self.r}w{self.warps}p{self.pf}{split}{tail}{ahead}"


# The instantiations in w4a16.cu: (mt, r, warps, depth) per pipeline and activation source.
STAGED = {(1, 1, 4, 4), (1, 1, 4, 2), (1, 1, 4, 3), (1, 1, 8, 4), (1, 1, 8, 2), (1, 2, 4, 2),
          (1, 2, 4, 4), (1, 2, 8, 2), (1, 4, 4, 2), (1, 1, 12, 6), (1, 1, 16, 4),
          (1, 1, 16, 6)}  # fmt: skip
STAGED_BULK = {(1, 1, 4, 4), (1, 1, 4, 6), (1, 1, 8, 3), (1, 2, 4, 3), (1, 2, 4, 4), (1, 4, 4, 2),
               (1, 1, 16, 3), (1, 1, 16, 5)}  # fmt: skip
GLOBAL = {(1, 1, 4, 4), (1, 2, 4, 2), (2, 1, 4, 4), (2, 2, 4, 2), (1, 4, 4, 2), (2, 4, 4, 2),
          (1, 1, 8, 4), (2, 1, 8, 4), (1, 2, 8, 2), (2, 2, 8, 2), (1, 1, 16, 2),
          (2, 1, 16, 2)}  # fmt: skip
GLOBAL_BULK = {(1, 1, 4, 4), (1, 2, 4, 3), (2, 1, 4, 4), (2, 2, 4, 3), (1, 4, 4, 2), (2, 4, 4, 2),
               (1, 2, 8, 3), (2, 2, 8, 3), (1, 4, 8, 2), (2, 4, 8, 2)}  # fmt: skip
# Split-K merged in a cluster (W4_CLUSTER_KERNEL): the register-pipeline shapes whose
# split configs the decode and verify steps run.
CLUSTER_STAGED = {(1, 1, 4, 4), (1, 1, 8, 2), (1, 1, 8, 4), (1, 2, 4, 2)}
CLUSTER_GLOBAL = {(1, 1, 4, 4), (2, 1, 4, 4), (1, 2, 4, 2), (2, 2, 4, 2)}
BULK_CAPABILITY = (9, 0)
CLUSTER_CAPABILITY = (9, 0)

# What start-up timing and bench/int4_linear.py try: every instantiation, 1, 2 or 4 splits
# (2..16 rows: the tile shapes built for both one and two n8 tiles).
ONE_ROW = tuple(
    W4Config(r, w, d, s, bulk)
    for bulk, table in ((False, STAGED), (True, STAGED_BULK))
    for (_, r, w, d) in sorted(table)
    for s in (1, 2, 4)
)
MULTI_ROW = tuple(
    W4Config(r, w, d, s, bulk)
    for bulk, table in ((False, GLOBAL), (True, GLOBAL_BULK))
    for (mt, r, w, d) in sorted(table)
    if mt == 1 and (2, r, w, d) in table
    for s in (1, 2, 4)
)
ONE_ROW += tuple(
    W4Config(r, w, d, s, cluster=True) for (_, r, w, d) in sorted(CLUSTER_STAGED) for s in (2, 4)
)
MULTI_ROW += tuple(
    W4Config(r, w, d, s, cluster=True)
    for (mt, r, w, d) in sorted(CLUSTER_GLOBAL)
    if mt == 1 and (2, r, w, d) in CLUSTER_GLOBAL
    for s in (2, 4)
)
# Activations one group ahead (W4_XPF_KERNEL, W4_XPF_BULK_KERNEL): a twin of every `g`
# shape. Split-K twins are not tried: in the run that chose these (bench/README.md,
# "activations one group ahead") no split won with them.
MULTI_ROW += tuple(
    W4Config(c.r, c.warps, c.pf, 1, c.bulk, xpf=True)
    for c in MULTI_ROW
    if c.splits == 1 and not c.cluster
)


def runs_on(cfg: W4Config, capability: tuple[int, int]) -> bool:
    if cfg.cluster and capability < CLUSTER_CAPABILITY:
        return False
    return not cfg.bulk or capability >= BULK_CAPABILITY


def kernel_name(mt: int, cfg: W4Config, staged: bool, pick: bool = False) -> str:
    """The instantiation that runs cfg; `pick`: its twin with the greedy pick fused (one
    staged row only)."""
    if pick and (mt != 1 or not staged):
        raise ValueError("w4a16: the fused pick takes one staged row")
    return _kernel_name(mt, cfg, staged) + ("_pick" if pick else "")


def _kernel_name(mt: int, cfg: W4Config, staged: bool) -> str:
    # An xpf config runs the `x` twin of the global-source kernel of its shape.
    if cfg.xpf and (staged or cfg.cluster or cfg.splits > 1):
        raise ValueError(f"w4a16: xpf runs 2..16 rows without splits, not {cfg}")
    if cfg.bulk:
        table, depth, tail = (STAGED_BULK if staged else GLOBAL_BULK), "n", "b"
    elif cfg.cluster:
        table, depth, tail = (CLUSTER_STAGED if staged else CLUSTER_GLOBAL), "p", "c"
    else:
        table, depth, tail = (STAGED if staged else GLOBAL), "p", ""
    if (mt, cfg.r, cfg.warps, cfg.pf) not in table:
        raise ValueError(f"w4a16: no kernel for mt={mt} {cfg} ({'staged' if staged else 'global'})")
    src = "s" if staged else "g"
    ahead = "x" if cfg.xpf else ""
    return f"w4a16_m{mt}_r{cfg.r}_w{cfg.warps}_{depth}{cfg.pf}_{src}{tail}{ahead}"


def shared_bytes(cfg: W4Config, mt: int, staged: bool, groups_per_split: int) -> int:
    """Dynamic shared memory of a launch, laid out as w4a16.cu's bodies do."""
    frag = cfg.r * mt * 4
    total = groups_per_split * 256 if staged else 0  # the fp16 activation slice
    total += cfg.warps * frag * 128 if cfg.warps > 1 else 0  # warp reduction
    total += 64 * 4  # block-sum scratch and the split-K flag
    if cfg.cluster:  # this split's partials, read by the cluster's first block
        total += cfg.r * mt * 2 * 64 * 4  # [pair][2][32] floats
    if cfg.bulk:  # stages of weights and scales, and one mbarrier (+ pad) per stage
        total += cfg.pf * cfg.r * cfg.warps * (1024 + 32) + 16 * cfg.pf
    return total


class W4Args(ctypes.Structure):
    _fields_ = [
        ("qw", ctypes.c_void_p), ("sc", ctypes.c_void_p), ("x", ctypes.c_void_p),
        ("nw", ctypes.c_void_p), ("bias", ctypes.c_void_p), ("y", ctypes.c_void_p),
        ("res", ctypes.c_void_p), ("ws", ctypes.c_void_p), ("counters", ctypes.c_void_p),
        ("tiles", ctypes.c_int), ("k", ctypes.c_int), ("m", ctypes.c_int),
        ("x_stride", ctypes.c_int), ("y_stride", ctypes.c_int), ("inter", ctypes.c_int),
        ("splits", ctypes.c_int), ("groups_per_split", ctypes.c_int), ("epi", ctypes.c_int),
        ("norm", ctypes.c_int), ("x_bf16", ctypes.c_int), ("y_bf16", ctypes.c_int),
        ("eps", ctypes.c_float),
    ]  # fmt: skip


class PickPtrs(ctypes.Structure):
    """Where a one-row plain launch puts the greedy pick of its outputs (pick.cuh, fused
    into the epilogue): `ws` holds `parts` partials of 8 floats and more for their groups,
    `counter` zeros between launches, the rest as engine/cuda/greedy.py's kernel takes
    them (0: none). engine/cuda/greedy.py's FusedPick makes them."""

    _fields_ = [
        ("ws", ctypes.c_void_p), ("counter", ctypes.c_void_p), ("token", ctypes.c_void_p),
        ("out_token", ctypes.c_void_p), ("out_logprob", ctypes.c_void_p),
        ("advance", ctypes.c_void_p), ("sys_fence", ctypes.c_int), ("parts", ctypes.c_int),
    ]  # fmt: skip


class W4PickArgs(ctypes.Structure):
    """The `_pick` kernels' parameter: W4Args, then where the fused pick goes."""

    _fields_ = [("w", W4Args), ("p", PickPtrs)]


class DequantArgs(ctypes.Structure):
    _fields_ = [
        ("qw", ctypes.c_void_p), ("sc", ctypes.c_void_p), ("w", ctypes.c_void_p),
        ("tiles", ctypes.c_int), ("k", ctypes.c_int), ("glu", ctypes.c_int),
        ("inter", ctypes.c_int),
    ]  # fmt: skip


def _rows_of(r: int, tiles: int) -> int:
    """The largest tile count per block <= r that divides `tiles`."""
    while tiles % r:
        r //= 2
    return r


class CudaInt4:
    """One layer's INT4 weight in mma16 order, with the tile configs its calls run with.

    fusion: "" | "norm" | "residual" | "norm_glu" (the batch-1 glue the decoder folds in;
    "norm_glu" packs gate and up interleaved). `one_row` and `multi_row` are the
    configs for 1 and 2..16 rows; `prepare()` allocates their split-K buffers (before
    any graph capture)."""

    def __init__(
        self,
        codes: torch.Tensor,
        scales: torch.Tensor,
        bias: torch.Tensor | None,
        fusion: str = "",
        name: str = "weight",
        dtype: torch.dtype = torch.float16,
    ) -> None:
        self.name = name
        self.dtype = dtype
        self.fusion = fusion
        self.glu = fusion == "norm_glu"
        self.n, self.k = int(codes.shape[0]), int(codes.shape[1])
        self.tiles = self.n // TILE
        self.qw, self.sc = pack(codes, scales, self.glu, name)
        self.device = self.qw.device
        self.bias = None if bias is None else bias.detach().to(self.device, dtype).contiguous()
        self.one_row = W4Config()
        self.one_row_candidates: list[W4Config] = []  # fastest first, set by int4_swap
        self.multi_row = W4Config()
        self._buffers: dict[tuple[W4Config, int], tuple[torch.Tensor, torch.Tensor]] = {}
        from nib.engine.cuda.loader import Bound, pdl

        self._module = Bound("w4a16.cu", self.device)
        self.capability = torch.cuda.get_device_capability(self.device)
        self.bulk_ok = self.capability >= BULK_CAPABILITY
        # Programmatic dependent launch: the weights of this layer start streaming while
        # the previous kernel finishes (both kernels' code is written for it).
        self.pdl = pdl(self.device)

    def clone(self) -> CudaInt4:
        """A copy with its own weight tensors and split-K buffers (benchmarks rotate
        copies so that weights come from memory, not L2)."""
        twin = object.__new__(CudaInt4)
        twin.__dict__.update(self.__dict__)
        twin.qw, twin.sc = self.qw.clone(), self.sc.clone()
        twin._buffers = {}
        return twin

    @property
    def weight_bytes(self) -> int:
        return int(self.qw.numel() * 4 + self.sc.numel() * 4)

    @property
    def out_features(self) -> int:
        return self.n // 2 if self.glu else self.n

    def unpack(self) -> tuple[torch.Tensor, torch.Tensor]:
        return unpack(self.qw, self.sc, self.glu)

    def effective(self, cfg: W4Config, m: int) -> W4Config:
        """cfg with r fitted to the tile count and splits to the groups (what runs)."""
        r = _rows_of(cfg.r, self.tiles)
        groups = self.k // GROUP_SIZE
        splits = max(1, min(cfg.splits, groups // max(1, cfg.warps)))
        # One split has nothing to merge: the plain kernel of the same shape runs. One row
        # is staged in shared memory: nothing to load ahead.
        xpf = cfg.xpf and m > 1
        return W4Config(r, cfg.warps, cfg.pf, splits, cfg.bulk, cfg.cluster and splits > 1, xpf)

    def prepare(self, cfg: W4Config, m: int) -> None:
        """Allocate cfg's split-K partials and counters for m rows (before capture)."""
        cfg = self.effective(cfg, m)
        mt = 2 if m > 8 else 1
        if cfg.splits == 1 or cfg.cluster or (cfg, mt) in self._buffers:
            return
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"{self.name}: split-K buffers must exist before graph capture")
        blocks = self.tiles // cfg.r
        floats = blocks * cfg.splits * cfg.r * mt * 2 * 64
        self._buffers[(cfg, mt)] = (
            torch.empty(floats, dtype=torch.float32, device=self.device),
            torch.zeros(blocks, dtype=torch.int32, device=self.device),
        )

    def run(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        m: int,
        cfg: W4Config,
        epi: int,
        norm_weight: torch.Tensor | None = None,
        eps: float = 0.0,
        res: torch.Tensor | None = None,
        pick: PickPtrs | None = None,
    ) -> None:
        """y = epilogue(W x) for m rows of x (m = 1: fp16/bf16 x, else fp16 [m, K]); with
        `pick`, the greedy pick of y (one row, plain epilogue) in the same launch."""
        staged = m == 1
        mt = 2 if m > 8 else 1
        cfg = self.effective(cfg, m)
        if m > MAX_ROWS or (staged and self.k > MAX_K_STAGED):
            raise ValueError(f"{self.name}: w4a16 takes 1..{MAX_ROWS} rows, K <= {MAX_K_STAGED}")
        if cfg.bulk and not self.bulk_ok:
            raise ValueError(f"{self.name}: {cfg.label()} needs sm_90 (bulk copies)")
        if cfg.cluster and self.capability < CLUSTER_CAPABILITY:
            raise ValueError(f"{self.name}: {cfg.label()} needs sm_90 (thread-block clusters)")
        if pick is not None:
            if m != 1 or epi != EPI_PLAIN:
                raise ValueError(f"{self.name}: the fused pick takes one row, plain epilogue")
            if self.tiles // cfg.r > pick.parts:
                raise ValueError(
                    f"{self.name}: {cfg.label()} has {self.tiles // cfg.r} blocks of tiles; "
                    f"the pick's workspace holds {pick.parts}"
                )
        kernel = self._module.get().kernel(kernel_name(mt, cfg, staged, pick is not None))
        groups = self.k // GROUP_SIZE
        per_split = -(-groups // cfg.splits)
        ws = counters = None
        if cfg.splits > 1 and not cfg.cluster:
            self.prepare(cfg, m)
            ws, counters = self._buffers[(cfg, mt)]
        bias = self.bias
        if bias is not None and bias.dtype != y.dtype:
            bias = bias.to(y.dtype)  # a call in another dtype than the model's (tests)
        shared = shared_bytes(cfg, mt, staged, per_split)
        args = W4Args(
            self.qw.data_ptr(), self.sc.data_ptr(), x.data_ptr(),
            0 if norm_weight is None else norm_weight.data_ptr(),
            0 if bias is None else bias.data_ptr(), y.data_ptr(),
            y.data_ptr() if res is None else res.data_ptr(),
            0 if ws is None else ws.data_ptr(), 0 if counters is None else counters.data_ptr(),
            self.tiles, self.k, m, x.stride(0) if x.dim() == 2 else self.k,
            y.stride(0) if y.dim() == 2 else y.numel(), self.n // 2, cfg.splits, per_split, epi,
            int(norm_weight is not None), int(x.dtype == torch.bfloat16),
            int(y.dtype == torch.bfloat16), eps,
        )  # fmt: skip
        params: ctypes.Structure = args if pick is None else W4PickArgs(args, pick)
        grid = (self.tiles // cfg.r, cfg.splits)
        cluster = (1, cfg.splits, 1) if cfg.cluster else None
        kernel.launch(grid, (cfg.warps * 32,), params, shared, pdl=self.pdl, cluster=cluster)

    # -- what Int4Linear calls -------------------------------------------------------

    def linear(self, x: torch.Tensor, cfg: W4Config | None = None) -> torch.Tensor:
        """x [..., K] (any rows) -> [..., N] in x's dtype, logical [gate | up] order."""
        shape = x.shape
        x2 = x.reshape(-1, self.k)
        m = x2.shape[0]
        epi = EPI_GLU_PLAIN if self.glu else EPI_PLAIN
        if m == 1:
            y = torch.empty((1, self.n), dtype=x.dtype, device=x.device)
            self.run(x2.contiguous(), y, 1, cfg or self.one_row, epi)
        elif m <= MAX_ROWS:
            x16 = x2.to(torch.float16).contiguous()
            y = torch.empty((m, self.n), dtype=x.dtype, device=x.device)
            self.run(x16, y, m, cfg or self.multi_row, epi)
        else:
            w = self.dequantize16()
            y = torch.nn.functional.linear(x2.to(torch.float16), w).to(x.dtype)
            if self.bias is not None:
                y += self.bias.to(y.dtype)
        return y.view(*shape[:-1], self.n)

    def norm(
        self,
        h: torch.Tensor,
        norm_weight: torch.Tensor,
        eps: float,
        cfg: W4Config | None = None,
        pick: PickPtrs | None = None,
    ) -> torch.Tensor:
        """One row: W rms_norm(h) * norm_weight, or silu(gate) * up for a glu packing; with
        `pick` (not glu), the greedy pick of the result in the same launch."""
        y = torch.empty(self.out_features, dtype=h.dtype, device=h.device)
        epi = EPI_GLU if self.glu else EPI_PLAIN
        if pick is not None and self.glu:
            raise ValueError(f"{self.name}: the fused pick needs a plain packing, not glu")
        self.run(
            h.reshape(-1), y, 1, cfg or self.one_row, epi, norm_weight.reshape(-1), eps,
            pick=pick,
        )  # fmt: skip
        return y.view(*h.shape[:-1], self.out_features)

    def residual(
        self, x: torch.Tensor, residual: torch.Tensor, cfg: W4Config | None = None
    ) -> None:
        """One row: residual += W x, in place."""
        if not residual.is_contiguous() or residual.numel() != self.n:
            raise ValueError(f"{self.name}: residual must be one contiguous row of {self.n}")
        cfg = cfg or self.one_row
        self.run(x.reshape(-1).contiguous(), residual.view(-1), 1, cfg, EPI_RESIDUAL)

    def dequantize16(self) -> torch.Tensor:
        """The fp16 weight [N, K] in logical row order (one kernel; prefill's cuBLAS input)."""
        w = torch.empty((self.n, self.k), dtype=torch.float16, device=self.device)
        threads = self.tiles * (self.k // CHUNK) * 32
        args = DequantArgs(
            self.qw.data_ptr(), self.sc.data_ptr(), w.data_ptr(), self.tiles, self.k,
            int(self.glu), self.n // 2,
        )  # fmt: skip
        self._module.get().kernel("w4_dequant").launch((-(-threads // 256),), (256,), args)
        return w
