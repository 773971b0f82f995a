"""Matrix-vector product for batch-1 decode: y = W x (+ b), 16-bit weights.

cuBLAS reaches only ~1.2-2.5 TB/s on the small and mid-sized layers of a 1.5B
or 7B model at M = 1 (see ../shared H200 facts): too little for a decode step
that should run at the copy bandwidth. This kernel streams W once, rows split
across programs, fp32 accumulation. Which tile shape wins depends on the
layer, so `GemvLinear` picks per shape at start-up by timing (tune_gemv), and
keeps cuBLAS where cuBLAS is faster.

Napkin math (Qwen2.5-1.5B gate_up, 1536 -> 17920): 55 MB of bf16 weights; at
4.28 TB/s that is 12.9 µs (cuBLAS measured 17.4 µs).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import nn


@dataclass(frozen=True)
class GemvConfig:
    block_n: int
    block_k: int
    num_warps: int


CANDIDATES = (
    GemvConfig(4, 512, 4),
    GemvConfig(8, 256, 4),
    GemvConfig(8, 512, 4),
    GemvConfig(16, 256, 8),
    GemvConfig(2, 1024, 4),
    GemvConfig(4, 1024, 8),
)


@triton.jit
def _gemv_kernel(
    X,
    W,
    B,
    Y,
    N,
    stride_w,
    K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    acc = tl.zeros((BLOCK_N, BLOCK_K), tl.float32)
    for k0 in range(0, K, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        col_ok = cols < K
        w = tl.load(
            W + rows[:, None] * stride_w + cols[None, :],
            mask=row_ok[:, None] & col_ok[None, :],
            other=0.0,
        )
        x = tl.load(X + cols, mask=col_ok, other=0.0)
        acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
    y = tl.sum(acc, axis=1)
    if HAS_BIAS:
        y += tl.load(B + rows, mask=row_ok, other=0.0).to(tl.float32)
    tl.store(Y + rows, y.to(Y.dtype.element_ty), mask=row_ok)


def gemv(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, cfg: GemvConfig
) -> torch.Tensor:
    """x [..., K] with one row in total; weight [N, K] row-major."""
    n, k = weight.shape
    if x.numel() != k or weight.stride(1) != 1:
        raise ValueError(f"gemv: x must hold one row of {k} and weight must be row-major")
    xv = x.reshape(k)
    y = torch.empty(n, dtype=x.dtype, device=x.device)
    _gemv_kernel[(triton.cdiv(n, cfg.block_n),)](
        xv,
        weight,
        bias if bias is not None else weight,
        y,
        n,
        weight.stride(0),
        K=k,
        HAS_BIAS=bias is not None,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        num_warps=cfg.num_warps,
    )
    return y.view(*x.shape[:-1], n)


class GemvLinear(nn.Module):
    """nn.Linear's drop-in for the GPU: the Triton GEMV at one row, cuBLAS otherwise."""

    def __init__(self, linear: nn.Linear, config: GemvConfig | None) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias
        self.config = config  # None: cuBLAS at every row count

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gemv_linear(x, self.weight, self.bias, self.config)

    def kernel(self, rows: int) -> str:
        """The kernel an input of `rows` rows runs on."""
        return config_label(self.config) if rows == 1 else "cublas"

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, m1={self.kernel(1)}"


def gemv_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, config: GemvConfig | None
) -> torch.Tensor:
    """GemvLinear's forward: the Triton GEMV for one row (if configured), cuBLAS otherwise."""
    if config is not None and x.numel() == weight.shape[1]:
        return gemv(x, weight, bias, config)
    return F.linear(x, weight, bias)


def config_label(config: GemvConfig | None) -> str:
    if config is None:
        return "cublas"
    return f"gemv-{config.block_n}x{config.block_k}w{config.num_warps}"


def _time_layers(fn_per_layer: list[Callable[[], object]], iters: int = 20) -> float:
    """Median µs of one call, running every layer of a shape in turn (weights leave L2)."""
    for f in fn_per_layer:
        f()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(iters):
        start.record()
        for f in fn_per_layer:
            f()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / len(fn_per_layer))
    return sorted(times)[len(times) // 2]


def swap_in_gemv(model: nn.Module, tune: bool = True) -> dict[tuple[int, int], str]:
    """Replace every nn.Linear by GemvLinear, choosing per (out, in) shape the fastest
    of cuBLAS and the candidate tile configs by timing all layers of that shape.
    Returns {(out, in): chosen kernel name}."""
    linears = [(name, m) for name, m in model.named_modules() if type(m) is nn.Linear]
    by_shape: dict[tuple[int, int], list[tuple[str, nn.Linear]]] = {}
    for name, m in linears:
        by_shape.setdefault((m.out_features, m.in_features), []).append((name, m))
    choice: dict[tuple[int, int], GemvConfig | None] = {}
    for shape, mods in by_shape.items():
        device, dtype = mods[0][1].weight.device, mods[0][1].weight.dtype
        x = torch.randn(1, 1, shape[1], device=device, dtype=dtype)
        if not tune:
            choice[shape] = CANDIDATES[0]
            continue
        best: tuple[float, GemvConfig | None] = (
            _time_layers([partial(F.linear, x, m.weight, m.bias) for _, m in mods]),
            None,
        )
        for cfg in CANDIDATES:
            t = _time_layers([partial(gemv, x, m.weight, m.bias, cfg) for _, m in mods])
            if t < best[0]:
                best = (t, cfg)
        choice[shape] = best[1]
    for name, m in linears:
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, attr, GemvLinear(m, choice[(m.out_features, m.in_features)]))
    return {s: config_label(c) for s, c in choice.items()}
