"""Matrix-vector product for batch-1 decode: y = W x (+ b), 16-bit weights.

cuBLAS reaches only ~1.2-2.5 TB/s on the small and mid-sized layers of a 1.5B
or 7B model at M = 1 (see ../shared H200 facts): too little for a decode step
that should run at the copy bandwidth. This kernel streams W once, rows split
across programs, fp32 accumulation. Which tile shape wins depends on the
layer, so `swap_in_gemv` picks per shape at start-up by timing, and keeps
cuBLAS where cuBLAS is faster.

At batch 1 the glue around a product costs as much as moving its bytes (a
launch and a gap of ~2 µs each, 4-5 per layer), so the kernel also folds it
in: the RMSNorm before the product (each program sums the squares of the
few-KB input itself), the residual add after it (in place), and SiLU·mul
between gate_up and down (one program owns gate row j and up row j). A
decoder layer is then six launches: qkv+norm, RoPE+cache write, attention,
o_proj+residual, gate_up+norm+SiLU·mul, down+residual.

Where nib's CUDA kernels build and load (cuda/loader.py), the CUDA C++ GEMV
(cuda/gemv16.py: the same semantics, more loads in flight; `_launch` dispatches) joins
the candidates: a layer whose config is a `Gemv16Config` runs it, and a call it
cannot take (a misaligned or odd-typed tensor) runs the first Triton tile instead.

Napkin math (Qwen2.5-1.5B gate_up, 1536 -> 17920): 55 MB of bf16 weights; at
4.28 TB/s that is 12.9 µs (cuBLAS measured 17.4 µs).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import nn

from nib.engine.cuda import gemv16
from nib.engine.cuda.gemv16 import Gemv16Config
from nib.engine.cuda.timing import graph_us
from nib.engine.step_tuning import STEP_CANDIDATES

log = logging.getLogger("nib.engine")


@dataclass(frozen=True)
class GemvConfig:
    block_n: int
    block_k: int
    num_warps: int
    split_k: int = 1


CANDIDATES = (
    GemvConfig(4, 512, 4),
    GemvConfig(8, 256, 4),
    GemvConfig(8, 512, 4),
    GemvConfig(16, 256, 8),
    GemvConfig(2, 1024, 4),
    GemvConfig(4, 1024, 8),
    GemvConfig(4, 2048, 8),
    GemvConfig(8, 1024, 8),
    GemvConfig(2, 2048, 4),
    GemvConfig(1, 4096, 8),
    # Few output rows over a long K (a 7B o_proj, a 1.5B down_proj): more programs.
    GemvConfig(4, 512, 4, 2),
    GemvConfig(4, 512, 4, 4),
    GemvConfig(8, 512, 4, 4),
    GemvConfig(4, 1024, 8, 8),
)


# Any tile config of the batch-1 GEMV: the Triton kernel's or the CUDA kernel's.
AnyGemvConfig = GemvConfig | Gemv16Config
# What a CUDA config's call runs when its tensors break gemv16's rules (no split-K).
FALLBACK = CANDIDATES[0]

EPI_NONE, EPI_RESIDUAL, EPI_GLU = 0, 1, 2


@triton.jit
def _epilogue(y, y_up, rows, row_ok, B, Y, dtype, HAS_BIAS: tl.constexpr, EPILOGUE: tl.constexpr):
    if HAS_BIAS:
        y += tl.load(B + rows, mask=row_ok, other=0.0).to(tl.float32)
    if EPILOGUE == 1:
        r = tl.load(Y + rows, mask=row_ok, other=0.0).to(tl.float32)
        y = r + y.to(dtype).to(tl.float32)
    if EPILOGUE == 2:
        g = y.to(dtype).to(tl.float32)
        u = y_up.to(dtype).to(tl.float32)
        y = (g / (1.0 + tl.exp(-g))).to(dtype).to(tl.float32) * u
    tl.store(Y + rows, y.to(Y.dtype.element_ty), mask=row_ok)


@triton.jit
def _tile(W, rows, row_ok, cols, ok, N, stride_w, EPILOGUE: tl.constexpr):
    """W's BLOCK_N x BLOCK_K tile at (rows, cols) where ok, and (GLU) the up half's."""
    offs = rows[:, None] * stride_w + cols[None, :]
    mask = row_ok[:, None] & ok[None, :]
    w = tl.load(W + offs, mask=mask, other=0.0)
    w_up = w
    if EPILOGUE == 2:
        w_up = tl.load(W + N * stride_w + offs, mask=mask, other=0.0)
    return w, w_up


@triton.jit
def _accumulate(
    acc, acc_up, sq, w, w_up, X, NW, cols, col_ok, NORM: tl.constexpr, EPILOGUE: tl.constexpr
):
    """acc (and acc_up) += the tile times x[cols]; NORM: x * NW, and sq += x * x."""
    xf = tl.load(X + cols, mask=col_ok, other=0.0).to(tl.float32)
    if NORM:
        sq += xf * xf
        xf = xf * tl.load(NW + cols, mask=col_ok, other=0.0).to(tl.float32)
    acc += w.to(tl.float32) * xf[None, :]
    if EPILOGUE == 2:
        acc_up += w_up.to(tl.float32) * xf[None, :]
    return acc, acc_up, sq


@triton.jit
def _gemv_kernel(
    X, W, B, Y, NW, WS, LOCK,
    N, stride_w, eps,
    K: tl.constexpr, HAS_BIAS: tl.constexpr, NORM: tl.constexpr, EPILOGUE: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """y = W x (+ b), one program per BLOCK_N output rows (and 1/SPLIT_K of K), fp32
    accumulation.

    NORM: x is the residual stream h and the input is rms_norm(h) * NW. The product
    runs on NW * h and the row's 1/rms scales the sum at the end, so the squares are
    summed in the same pass (no dependent pre-pass before the weights stream); the
    normalised input is not rounded to 16 bits first, unlike the unfused reference.
    EPILOGUE 1 (residual): Y is the residual stream and Y[rows] += round(W x) in place.
    EPILOGUE 2 (GLU): W holds [gate; up] (2N rows); y = round(silu(round(gate))) * round(up).
    SPLIT_K > 1 (few rows, long K: more programs in flight): each program writes fp32
    partials to WS; the last of a row block to finish (an atomic counter in LOCK, which
    it resets) sums them and runs the epilogue. One launch, graph-safe.
    PDL (programmatic dependent launch, sm_90): the next kernel may launch as soon as
    this one runs, and this one's first weight tile is loaded before it waits for the
    previous kernel (griddepcontrol.wait), as nib's CUDA kernels do: the weights do not
    depend on it, x and the residual do. Each later tile is then loaded one step ahead.
    """
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    dtype = X.dtype.element_ty
    # This program's share of K, whole BLOCK_Ks (a constant: static trip counts).
    K_SPLIT: tl.constexpr = (K + SPLIT_K * BLOCK_K - 1) // (SPLIT_K * BLOCK_K) * BLOCK_K
    acc = tl.zeros((BLOCK_N, BLOCK_K), tl.float32)
    acc_up = tl.zeros((BLOCK_N, BLOCK_K), tl.float32)
    sq = tl.zeros((BLOCK_K,), tl.float32)
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        cols = pid_k * K_SPLIT + tl.arange(0, BLOCK_K)
        w, w_up = _tile(W, rows, row_ok, cols, cols < K, N, stride_w, EPILOGUE)
        tl.extra.cuda.gdc_wait()
        for i in range(0, K_SPLIT, BLOCK_K):
            cols = pid_k * K_SPLIT + i + tl.arange(0, BLOCK_K)
            acc, acc_up, sq = _accumulate(
                acc, acc_up, sq, w, w_up, X, NW, cols, cols < K, NORM, EPILOGUE
            )
            # The next tile (none past this program's share of K).
            cols = cols + BLOCK_K
            ok = (cols < K) & (i + BLOCK_K < K_SPLIT)
            w, w_up = _tile(W, rows, row_ok, cols, ok, N, stride_w, EPILOGUE)
    else:
        for i in range(0, K_SPLIT, BLOCK_K):
            cols = pid_k * K_SPLIT + i + tl.arange(0, BLOCK_K)
            w, w_up = _tile(W, rows, row_ok, cols, cols < K, N, stride_w, EPILOGUE)
            acc, acc_up, sq = _accumulate(
                acc, acc_up, sq, w, w_up, X, NW, cols, cols < K, NORM, EPILOGUE
            )
    y = tl.sum(acc, axis=1)
    y_up = tl.sum(acc_up, axis=1)
    ss = tl.sum(sq, axis=0)
    if SPLIT_K == 1:
        if NORM:
            inv = 1.0 / tl.sqrt(ss / K + eps)
            y = y * inv
            y_up = y_up * inv
        _epilogue(y, y_up, rows, row_ok, B, Y, dtype, HAS_BIAS, EPILOGUE)
    else:
        # WS: [SPLIT_K, 3 * N] fp32: plain/gate partials, up partials, and each row
        # block's partial sum of squares (at 2N + pid_n: ordered by that block's counter).
        base = WS + pid_k * 3 * N
        tl.store(base + rows, y, mask=row_ok)
        if EPILOGUE == 2:
            tl.store(base + N + rows, y_up, mask=row_ok)
        if NORM:
            tl.store(base + 2 * N + pid_n, ss)
        tl.debug_barrier()
        arrived = tl.atomic_add(LOCK + pid_n, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT_K - 1:
            y = tl.zeros((BLOCK_N,), tl.float32)
            y_up = tl.zeros((BLOCK_N,), tl.float32)
            ss = tl.sum(tl.zeros((BLOCK_N,), tl.float32), axis=0)
            for s in range(SPLIT_K):
                part = WS + s * 3 * N
                y += tl.load(part + rows, mask=row_ok, other=0.0, cache_modifier=".cg")
                if EPILOGUE == 2:
                    y_up += tl.load(part + N + rows, mask=row_ok, other=0.0, cache_modifier=".cg")
                if NORM:
                    ss += tl.load(part + 2 * N + pid_n, cache_modifier=".cg")
            if NORM:
                inv = 1.0 / tl.sqrt(ss / K + eps)
                y = y * inv
                y_up = y_up * inv
            _epilogue(y, y_up, rows, row_ok, B, Y, dtype, HAS_BIAS, EPILOGUE)
            tl.atomic_xchg(LOCK + pid_n, 0, sem="relaxed", scope="gpu")


SplitBuffers = tuple[torch.Tensor, torch.Tensor]  # (fp32 partials, int32 counters)


def split_buffers(
    n: int, cfg: GemvConfig | Any, device: torch.device, parts: int = 3
) -> SplitBuffers | None:
    """The split-K workspace and counters one layer needs for cfg (None without split):
    allocated once per layer, since a captured graph keeps their addresses. `parts`
    fp32 vectors of n per split (here: plain/gate, up, sums of squares); cfg is any
    tile config with block_n and split_k (quant/fused_gemv.py's too)."""
    if cfg.split_k == 1:
        return None
    return (
        torch.empty(cfg.split_k * parts * n, dtype=torch.float32, device=device),
        torch.zeros(triton.cdiv(n, cfg.block_n), dtype=torch.int32, device=device),
    )


# The launch arguments of the PDL constexpr, without and with programmatic dependent launch.
PDL_ARGS = {False: {"PDL": False}, True: {"PDL": True, "launch_pdl": True}}
_PDL: dict[int, bool] = {}  # per CUDA device index: whether the Triton GEMV launches with PDL


def pdl_launch(device: torch.device) -> dict[str, bool]:
    """The launch arguments for the PDL constexpr of nib's Triton kernels on `device`:
    programmatic dependent launch where nib's CUDA kernels use it (cuda/loader.pdl) and
    this Triton launches with it (its `launch_pdl` option); otherwise plain launches."""
    if device.type != "cuda":
        return PDL_ARGS[False]  # Triton's interpreter (CPU tests) runs no inline PTX
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _PDL:
        from triton.backends.nvidia.compiler import CUDAOptions

        from nib.engine.cuda.loader import pdl

        _PDL[index] = pdl(device) and "launch_pdl" in CUDAOptions.__dataclass_fields__
    return PDL_ARGS[_PDL[index]]


def _launch(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    n: int,
    cfg: AnyGemvConfig,
    norm_weight: torch.Tensor | None = None,
    eps: float = 0.0,
    epilogue: int = EPI_NONE,
    buffers: SplitBuffers | None = None,
) -> None:
    """out[:n] = (epilogue of) W x, on the kernel cfg names: the CUDA GEMV for a
    Gemv16Config whose call meets gemv16's rules, else the Triton kernel (FALLBACK for a
    CUDA config whose tensors break them)."""
    if isinstance(cfg, Gemv16Config):
        nw = None if norm_weight is None else norm_weight.reshape(-1)
        if gemv16.accepts(x, weight, bias, nw, out):
            epi = gemv16.EPI_RESIDUAL if epilogue == EPI_RESIDUAL else gemv16.EPI_PLAIN
            gemv16.launch(
                x.reshape(-1), weight, bias, out.view(-1), n, cfg, nw, eps, epi,
                glu=epilogue == EPI_GLU, buffers=buffers,
            )  # fmt: skip
            return
        cfg, buffers = FALLBACK, None
    k = weight.shape[1]
    if x.numel() != k or weight.stride(1) != 1:
        raise ValueError(f"gemv: x must hold one row of {k} and weight must be row-major")
    if cfg.split_k > 1 and buffers is None:
        buffers = split_buffers(n, cfg, x.device)  # one-off call (tests, tuning)
    ws, lock = buffers if buffers is not None else (out, out)
    _gemv_kernel[(triton.cdiv(n, cfg.block_n), cfg.split_k)](
        x.reshape(k), weight, bias if bias is not None else weight, out,
        norm_weight if norm_weight is not None else weight, ws, lock,
        n, weight.stride(0), eps,
        K=k, HAS_BIAS=bias is not None, NORM=norm_weight is not None, EPILOGUE=epilogue,
        BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT_K=cfg.split_k, num_warps=cfg.num_warps,
        **pdl_launch(x.device),
    )  # fmt: skip


def gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    cfg: AnyGemvConfig,
    buffers: SplitBuffers | None = None,
) -> torch.Tensor:
    """x [..., K] with one row in total; weight [N, K] row-major."""
    n = weight.shape[0]
    y = torch.empty(n, dtype=x.dtype, device=x.device)
    _launch(x, weight, bias, y, n, cfg, buffers=buffers)
    return y.view(*x.shape[:-1], n)


def norm_gemv(
    h: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    cfg: AnyGemvConfig,
    glu: bool = False,
    buffers: SplitBuffers | None = None,
) -> torch.Tensor:
    """W rms_norm(h) (+ b) in one kernel; with glu, W is [gate; up] and the result is
    silu(gate) * up. h [..., K] holds one row."""
    n = weight.shape[0] // 2 if glu else weight.shape[0]
    if glu and bias is not None:
        raise ValueError("norm_gemv: the GLU epilogue takes no bias")
    y = torch.empty(n, dtype=h.dtype, device=h.device)
    epilogue = EPI_GLU if glu else EPI_NONE
    _launch(h, weight, bias, y, n, cfg, norm_weight, eps, epilogue, buffers)
    return y.view(*h.shape[:-1], n)


def gemv_residual(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    residual: torch.Tensor,
    cfg: AnyGemvConfig,
    buffers: SplitBuffers | None = None,
) -> None:
    """residual += W x (+ b), in place, in one kernel (x and residual hold one row)."""
    if not residual.is_contiguous() or residual.numel() != weight.shape[0]:
        raise ValueError("gemv_residual: residual must be one contiguous row of the output size")
    n = weight.shape[0]
    _launch(x, weight, bias, residual, n, cfg, epilogue=EPI_RESIDUAL, buffers=buffers)


# What each linear of a decoder block fuses on the batch-1 path (model.py's order).
FUSIONS = {
    "attention.wqkv": "norm",
    "attention.wo": "residual",
    "feed_forward.w_gate_up": "norm_glu",
    "feed_forward.w_down": "residual",
    "output": "norm",
}


def fusion_of(name: str) -> str:
    return next((f for suffix, f in FUSIONS.items() if name.endswith(suffix)), "")


class GemvLinear(nn.Module):
    """nn.Linear's drop-in for the GPU: the batch-1 GEMV at one row, cuBLAS otherwise.

    `fusion` names what the batch-1 path folds into the product (ops.py calls
    the fused entry points): "norm" (the RMSNorm before it), "residual" (the
    residual add after it), "norm_glu" (both the norm and SiLU·mul), or "".
    `fused` is the tile config for that fused kernel (None: no fusion). A config
    is the Triton kernel's (GemvConfig) or the CUDA kernel's (Gemv16Config): the
    entry points dispatch on its type."""

    def __init__(
        self,
        linear: nn.Linear,
        config: AnyGemvConfig | None,
        fusion: str = "",
        fused: AnyGemvConfig | None = None,
    ) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias
        self.config = config  # None: cuBLAS at every row count
        self.fusion = fusion if fused is not None else ""
        self.fused = fused
        device = self.weight.device
        self.buffers = None if config is None else split_buffers(self.out_features, config, device)
        fused_n = self.out_features // 2 if self.fusion == "norm_glu" else self.out_features
        self.fused_buffers = None if fused is None else split_buffers(fused_n, fused, device)
        self.fused_candidates: list[AnyGemvConfig] = []  # set by swap_in_gemv (tuned)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gemv_linear(x, self.weight, self.bias, self.config, self.buffers)

    def norm_forward(
        self, h: torch.Tensor, norm_weight: torch.Tensor, eps: float, glu: bool
    ) -> torch.Tensor:
        """The fused kernel: self(rms_norm(h) * norm_weight), silu(gate) * up with glu."""
        assert self.fused is not None
        return norm_gemv(
            h, norm_weight, eps, self.weight, self.bias, self.fused, glu, self.fused_buffers
        )

    def residual_forward(self, x: torch.Tensor, residual: torch.Tensor) -> None:
        """The fused kernel: residual += self(x), in place."""
        assert self.fused is not None
        gemv_residual(x, self.weight, self.bias, residual, self.fused, self.fused_buffers)

    def kernel(self, rows: int) -> str:
        """The kernel an input of `rows` rows runs on."""
        if rows == 1 and self.fused is not None:
            return f"{config_label(self.fused)} +{self.fusion}"
        return config_label(self.config) if rows == 1 else "cublas"

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, m1={self.kernel(1)}"


def gemv_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    config: AnyGemvConfig | None,
    buffers: SplitBuffers | None = None,
) -> torch.Tensor:
    """GemvLinear's forward: the batch-1 GEMV for one row (if configured), cuBLAS otherwise."""
    if config is not None and x.numel() == weight.shape[1]:
        return gemv(x, weight, bias, config, buffers)
    return F.linear(x, weight, bias)


def config_label(config: AnyGemvConfig | None) -> str:
    if config is None:
        return "cublas"
    if isinstance(config, Gemv16Config):
        return config.label()
    split = f"s{config.split_k}" if config.split_k > 1 else ""
    return f"gemv-{config.block_n}x{config.block_k}w{config.num_warps}{split}"


def _time_layers(
    fn_per_layer: list[Callable[[], object]], iters: int = 20, graph: bool = False
) -> float:
    """Median µs of one call, running every layer of a shape in turn (weights leave L2).

    graph: time replays of a CUDA graph of those calls (cuda/timing.py), which is what
    the decode graph pays; run eagerly, a small layer's kernel finishes before the host
    has launched the next, and the timing measures the launch path (Python, ctypes)
    instead of the kernel. Eager timing if the capture fails."""
    if graph:
        try:
            return graph_us(fn_per_layer, calls=GRAPH_CALLS, reps=iters)
        except RuntimeError:
            log.warning("gemv tuning: graph capture failed; timing eagerly", exc_info=True)
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


GRAPH_CALLS = 32  # calls per timed graph replay (a shape with fewer layers repeats them)


def _fused_call(
    fusion: str, m: nn.Linear, cfg: AnyGemvConfig, x: torch.Tensor, scratch: torch.Tensor
) -> Callable[[], object]:
    glu = fusion == "norm_glu"
    buffers = split_buffers(m.out_features // 2 if glu else m.out_features, cfg, x.device)
    if fusion == "residual":
        return partial(gemv_residual, x, m.weight, m.bias, scratch, cfg, buffers)
    norm_weight = torch.ones_like(x).view(-1)
    return partial(norm_gemv, x, norm_weight, 1e-6, m.weight, m.bias, cfg, glu, buffers)


def _plain_calls(
    cfg: AnyGemvConfig | None, mods: list[nn.Linear], x: torch.Tensor
) -> list[Callable[[], object]]:
    if cfg is None:
        return [partial(F.linear, x, m.weight, m.bias) for m in mods]
    buffers = split_buffers(mods[0].out_features, cfg, x.device)
    return [partial(gemv, x, m.weight, m.bias, cfg, buffers) for m in mods]


def _fused_calls(
    fusion: str, cfg: AnyGemvConfig, mods: list[nn.Linear], x: torch.Tensor, scratch: torch.Tensor
) -> list[Callable[[], object]]:
    return [_fused_call(fusion, m, cfg, x, scratch) for m in mods]


def _candidates(weight: torch.Tensor, fusion: str) -> list[AnyGemvConfig]:
    """The Triton tiles and, where nib's CUDA kernels run on this GPU and take this
    weight, the CUDA kernel's configs for the shape."""
    out: list[AnyGemvConfig] = list(CANDIDATES)
    glu = fusion == "norm_glu"
    if gemv16.supports(weight, glu):
        return out
    from nib.engine.cuda.loader import available

    if available(weight.device):
        n, k = weight.shape
        sms = torch.cuda.get_device_properties(weight.device).multi_processor_count
        out += gemv16.candidates(n // 2 if glu else n, k, glu, sms)
    return out


def _ranked(
    calls: list[tuple[AnyGemvConfig | None, Callable[[], list[Callable[[], object]]]]],
) -> list[AnyGemvConfig | None]:
    """The configs, fastest first (the first listed on a tie), by the time their calls
    (every layer of a shape, in turn; built lazily) take inside a CUDA graph. A CUDA
    config that fails here is left out (the Triton tiles and cuBLAS always run)."""
    timed: list[tuple[float, int, AnyGemvConfig | None]] = []
    for i, (cfg, make) in enumerate(calls):
        try:
            t = _time_layers(make(), graph=True)
        except Exception:
            if not isinstance(cfg, Gemv16Config):
                raise
            log.warning("gemv tuning: %s failed here; not a candidate", cfg.label(), exc_info=True)
            continue
        timed.append((t, i, cfg))
    assert timed
    return [cfg for _, _, cfg in sorted(timed, key=lambda e: e[:2])]


def swap_in_gemv(
    model: nn.Module, tune: bool = True, fuse: bool = True
) -> dict[tuple[int, int], str]:
    """Replace every nn.Linear by GemvLinear, choosing per (out, in) shape the fastest
    of cuBLAS and the candidate configs (Triton tiles; the CUDA kernel's where it runs)
    by timing all layers of that shape, and (fuse) per (shape, fusion) the fastest
    config of the fused kernel. Untuned, every layer takes the first Triton tile.
    Returns {(out, in): chosen kernel name}."""
    linears = [(name, m) for name, m in model.named_modules() if type(m) is nn.Linear]
    by_shape: dict[tuple[int, int], list[tuple[str, nn.Linear]]] = {}
    for name, m in linears:
        by_shape.setdefault((m.out_features, m.in_features), []).append((name, m))
    choice: dict[tuple[int, int], AnyGemvConfig | None] = {}
    fused: dict[tuple[int, int, str], AnyGemvConfig] = {}
    runners_up: dict[tuple[int, int, str], list[AnyGemvConfig]] = {}
    for shape, mods in by_shape.items():
        device, dtype = mods[0][1].weight.device, mods[0][1].weight.dtype
        x = torch.randn(1, 1, shape[1], device=device, dtype=dtype)
        fusions = {fusion_of(name) for name, _ in mods} - {""} if fuse else set()
        if not tune:
            choice[shape] = CANDIDATES[0]
            fused.update({(*shape, f): CANDIDATES[0] for f in fusions})
            continue
        weight = mods[0][1].weight
        # A shape whose every layer fuses runs the plain kernel only off the fast path
        # (never at one row in practice): it takes the fused kernel's tiles untimed.
        if not (fusions and all(fusion_of(name) for name, _ in mods)):
            members = [m for _, m in mods]
            configs: list[AnyGemvConfig | None] = [None, *_candidates(weight, "")]
            choice[shape] = _ranked([(c, partial(_plain_calls, c, members, x)) for c in configs])[0]
        for fusion in fusions:
            group = [m for name, m in mods if fusion_of(name) == fusion]
            scratch = torch.zeros(shape[0], device=device, dtype=dtype)
            ranked = _ranked(
                [
                    (c, partial(_fused_calls, fusion, c, group, x, scratch))
                    for c in _candidates(weight, fusion)
                ]
            )
            fused[(*shape, fusion)] = ranked[0]  # type: ignore[assignment]
            runners_up[(*shape, fusion)] = [c for c in ranked if c is not None][:STEP_CANDIDATES]
    labels: dict[tuple[int, int], str] = {}
    for name, m in linears:
        shape = (m.out_features, m.in_features)
        fusion = fusion_of(name) if fuse else ""
        fused_cfg = fused.get((*shape, fusion))
        plain = choice.get(shape, fused_cfg)
        module = GemvLinear(m, plain, fusion, fused_cfg)
        # The fused kernel's runners-up, for the decode step's own timing (step_tuning.py).
        module.fused_candidates = runners_up.get((*shape, fusion), [])
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, attr, module)
        labels[shape] = module.kernel(1)
    return labels
