"""The 16-bit batch-1 GEMV on the CUDA cores (gemv16.cu): configs, argument struct, launches.

At one row a decode step streams every weight byte once, so the GEMV should run
at the copy bandwidth; the Triton kernel (kernels/gemv.py) reaches 3.3-3.7 TB/s
on 7B layers and much less at K = 1536. gemv16.cu keeps U 16-byte loads per
row in flight in each lane's registers and does ~2 instructions per weight, so
memory, not issue, sets its pace. `launch` computes kernels/gemv.py's
`_launch` (same semantics and epilogues); kernels/gemv.py's entry points
(`gemv`, `norm_gemv`, `gemv_residual`) call it when a layer's tuned config is a
`Gemv16Config` and the call's tensors meet `accepts`.

Napkin math (Llama-2-7B gate_up, 4096 -> 22016, bf16): 180 MB of weights; at
4.28 TB/s that is 42.1 us (cuBLAS: 45.8 us).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

EPI_PLAIN, EPI_RESIDUAL = 0, 1
CHUNK = 8  # 16-bit values per 16-byte load
STRIDE = 32 * CHUNK  # inputs a warp covers per load of one row
MAX_K = 32768  # the staged fp32 activations: up to 128 KB of shared memory
SCRATCH = 128  # bytes of shared memory before the activations (block_sum)

# The instantiations in gemv16.cu, (rows, warps, unroll): G16_PLAIN and G16_GLU. GLU is
# a subset of PLAIN: swap_in_gemv gives a gate_up layer its GLU config for the plain
# product too.
PLAIN = frozenset({(1, 4, 4), (1, 4, 8), (2, 4, 4), (2, 4, 8), (4, 4, 4), (1, 8, 8), (2, 8, 4)})
GLU = frozenset({(1, 4, 4), (1, 4, 8), (2, 4, 4), (1, 8, 8), (2, 8, 4)})


@dataclass(frozen=True)
class Gemv16Config:
    """One launch shape: each warp owns `rows` output rows at a time (GLU: their gate and
    up rows), keeps `unroll` 16-byte loads per weight row in flight, and streams
    `per_warp` such row groups back to back; `warps` per block share the staged
    activations; `split_k` blocks share a row group's K (few rows over a long K)."""

    rows: int = 2
    warps: int = 4
    unroll: int = 4
    per_warp: int = 1
    split_k: int = 1

    @property
    def block_n(self) -> int:
        """Output rows per split-K counter (kernels/gemv.py's split_buffers sizes by it)."""
        return self.rows

    def label(self) -> str:
        tail = f"t{self.per_warp}" if self.per_warp > 1 else ""
        tail += f"s{self.split_k}" if self.split_k > 1 else ""
        return f"cuda gemv16 r{self.rows}w{self.warps}u{self.unroll}{tail}"


def kernel_name(cfg: Gemv16Config, dtype: torch.dtype, glu: bool) -> str:
    table = GLU if glu else PLAIN
    if (cfg.rows, cfg.warps, cfg.unroll) not in table:
        raise ValueError(f"gemv16: no {'GLU ' if glu else ''}kernel for {cfg}")
    dt = "bf16" if dtype == torch.bfloat16 else "fp16"
    return f"gemv16_{dt}_r{cfg.rows}w{cfg.warps}u{cfg.unroll}{'_glu' if glu else ''}"


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Launch:
    """The geometry of one call: what the kernel derives from G16Args, computed here once
    (tests check it covers every row and input exactly once)."""

    groups: int  # row groups of cfg.rows output rows
    grid: tuple[int, int]  # (blocks along rows, splits)
    k_split: int  # inputs per split
    splits: int  # splits that hold inputs (<= cfg.split_k)
    shared: int  # dynamic shared memory bytes


def geometry(n: int, k: int, cfg: Gemv16Config) -> Launch:
    """Launch geometry for n output rows over k inputs."""
    groups = _cdiv(n, cfg.rows)
    k_split, splits = k, 1
    if cfg.split_k > 1:
        k_split = _cdiv(_cdiv(k, cfg.split_k), STRIDE) * STRIDE
        splits = _cdiv(k, k_split)
        if splits == 1:
            k_split = k
    # The kernel's loads per row and group: whole multiples of unroll (zero-padded).
    n_it = _cdiv(min(k, k_split), STRIDE * cfg.unroll) * cfg.unroll
    shared = SCRATCH + n_it * 32 * 2 * 16
    blocks = _cdiv(groups, cfg.warps * cfg.per_warp)
    return Launch(groups, (blocks, splits), k_split, splits, shared)


def shape_rule(n: int, k: int, row_stride: int, dtype: torch.dtype, glu: bool = False) -> str:
    """'' if gemv16.cu takes a weight of n rows over k inputs, else the rule it breaks."""
    if dtype not in (torch.bfloat16, torch.float16):
        return f"dtype {dtype} is not bf16 or fp16"
    if k < CHUNK or k % CHUNK or k > MAX_K:
        return f"in_features {k} is not a multiple of {CHUNK} up to {MAX_K} (16-byte loads)"
    if row_stride % CHUNK:
        return f"the weight's row stride {row_stride} is not a multiple of {CHUNK}"
    if n < (2 if glu else 1) or (glu and n % 2):
        return f"a fused gate/up of {n} rows is not two equal halves"
    return ""


def supports(weight: torch.Tensor, glu: bool = False) -> str:
    """'' if gemv16.cu can run this weight, else the rule it breaks."""
    if weight.dim() != 2 or weight.device.type != "cuda":
        return "not a 2-D CUDA tensor"
    if weight.stride(1) != 1 or weight.data_ptr() % 16:
        return "weight rows are not contiguous and 16-byte aligned"
    n, k = weight.shape
    return shape_rule(n, k, weight.stride(0), weight.dtype, glu)


def _aligned(t: torch.Tensor | None, numel: int, dtype: torch.dtype) -> bool:
    if t is None:
        return True
    return (
        t.dtype == dtype
        and t.numel() == numel
        and t.is_contiguous()
        and t.data_ptr() % 16 == 0
        and t.device.type == "cuda"
    )


def accepts(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    norm_weight: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> bool:
    """Whether one call's tensors meet the kernel's rules (kernels/gemv.py falls back to
    Triton otherwise): one row of K in the weight's dtype, contiguous, 16-byte aligned."""
    k = weight.shape[1]
    d = weight.dtype
    return (
        supports(weight) == ""
        and _aligned(x, k, d)
        and _aligned(norm_weight, k, d)
        and (bias is None or (bias.dtype == d and bias.is_contiguous()))
        and (out is None or (out.dtype == d and out.is_contiguous()))
    )


class G16Args(ctypes.Structure):
    _fields_ = [
        ("w", ctypes.c_void_p), ("x", ctypes.c_void_p), ("nw", ctypes.c_void_p),
        ("bias", ctypes.c_void_p), ("y", ctypes.c_void_p), ("ws", ctypes.c_void_p),
        ("counters", ctypes.c_void_p),
        ("n", ctypes.c_int), ("k", ctypes.c_int), ("stride", ctypes.c_int),
        ("groups", ctypes.c_int), ("per_warp", ctypes.c_int), ("splits", ctypes.c_int),
        ("k_split", ctypes.c_int), ("epi", ctypes.c_int), ("norm", ctypes.c_int),
        ("eps", ctypes.c_float),
    ]  # fmt: skip


SplitBuffers = tuple[torch.Tensor, torch.Tensor]  # (fp32 partials, int32 counters)


def split_buffers(n: int, cfg: Gemv16Config, device: torch.device) -> SplitBuffers | None:
    """The partials ([splits][2][n] fp32) and per-group counters one layer needs (None
    without split); kernels/gemv.py's split_buffers allocates the same or more."""
    if cfg.split_k == 1:
        return None
    return (
        torch.empty(cfg.split_k * 2 * n, dtype=torch.float32, device=device),
        torch.zeros(_cdiv(n, cfg.rows), dtype=torch.int32, device=device),
    )


def launch(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    n: int,
    cfg: Gemv16Config,
    norm_weight: torch.Tensor | None = None,
    eps: float = 0.0,
    epi: int = EPI_PLAIN,
    glu: bool = False,
    buffers: SplitBuffers | None = None,
) -> None:
    """out[:n] = epilogue(W x) (glu: W is [gate; up] of 2n rows); see gemv16.cu."""
    k = weight.shape[1]
    why = supports(weight, glu)
    if why:
        raise ValueError(f"gemv16: {why}")
    if not accepts(x, weight, bias, norm_weight, out) or out.numel() != n:
        raise ValueError(
            f"gemv16: x, the norm weight and the output must be contiguous, 16-byte aligned, "
            f"of the weight's dtype {weight.dtype}, with {k} and {n} elements"
        )
    if glu and (bias is not None or weight.shape[0] != 2 * n):
        raise ValueError("gemv16: the GLU epilogue takes [gate; up] (2n rows) and no bias")
    if bias is not None and bias.numel() != n:
        raise ValueError(f"gemv16: bias must hold {n} values")
    geo = geometry(n, k, cfg)
    ws = counters = None
    if geo.splits > 1:
        if buffers is None:
            buffers = split_buffers(n, cfg, x.device)  # one-off call (tests, tuning)
        assert buffers is not None
        ws, counters = buffers
        if ws.numel() < geo.splits * 2 * n or counters.numel() < geo.groups:
            raise ValueError(f"gemv16: split-K buffers too small for {cfg} at n={n}")
    from nib.engine.cuda.driver import ptr
    from nib.engine.cuda.loader import module, pdl

    kernel = module("gemv16.cu", x.device).kernel(kernel_name(cfg, weight.dtype, glu))
    args = G16Args(
        ptr(weight), ptr(x), ptr(norm_weight), ptr(bias), ptr(out), ptr(ws), ptr(counters),
        n, k, weight.stride(0), geo.groups, cfg.per_warp, geo.splits, geo.k_split, epi,
        int(norm_weight is not None), eps,
    )  # fmt: skip
    kernel.launch(geo.grid, (cfg.warps * 32,), args, geo.shared, pdl=pdl(x.device))


def reference(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    norm_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    glu: bool = False,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """What the kernel computes, in float64 with its rounding points (kernels/gemv.py's
    Triton kernel's): the sums are exact here, the 16-bit roundings are the same."""
    dt = weight.dtype

    def rnd(v: torch.Tensor) -> torch.Tensor:
        return v.to(dt).double()

    xf = x.reshape(-1).double()
    inv = 1.0
    if norm_weight is not None:
        inv = float(1.0 / torch.sqrt(xf.pow(2).mean() + eps))
        xf = xf * norm_weight.reshape(-1).double()
    y = (weight.double() @ xf) * inv
    if glu:
        n = weight.shape[0] // 2
        g, u = rnd(y[:n]), rnd(y[n:])
        return rnd(g / (1 + torch.exp(-g))).mul(u).to(dt)
    if bias is not None:
        y = y + bias.double()
    if residual is not None:
        y = residual.reshape(-1).double() + rnd(y)
    return y.to(dt)


# What start-up times per layer shape (kernels/gemv.py's swap_in_gemv): every
# instantiation one group per warp; the common ones streaming 2 or 4 groups per warp
# (large N: fewer blocks staging the activations); and split K for few rows.
_BASE = ((2, 4, 4), (1, 4, 8), (2, 4, 8), (4, 4, 4), (1, 8, 8), (2, 8, 4), (1, 4, 4))
_STREAMED = ((2, 4, 4), (1, 4, 8), (2, 8, 4))
_SPLIT = ((2, 4, 4), (1, 4, 8), (1, 8, 8))


def candidates(n: int, k: int, glu: bool, sms: int = 132) -> list[Gemv16Config]:
    """The configs worth timing for n output rows over k inputs (glu: n gate/up pairs)."""
    table = GLU if glu else PLAIN
    out: list[Gemv16Config] = []
    for r, w, u in _BASE:
        if (r, w, u) in table:
            out.append(Gemv16Config(r, w, u))
    for r, w, u in _STREAMED:
        for t in (2, 4):
            if (r, w, u) in table and _cdiv(_cdiv(n, r), w * t) >= 2 * sms:
                out.append(Gemv16Config(r, w, u, per_warp=t))
    for r, w, u in _SPLIT:
        for s in (2, 4, 8):
            warps = _cdiv(n, r) * s
            if (r, w, u) in table and k // s >= 1024 and warps <= 64 * sms:
                out.append(Gemv16Config(r, w, u, split_k=s))
    return out
