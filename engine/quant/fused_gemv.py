"""The batch-1 INT4 GEMV with the decoder's glue folded in: y = W x for one row.

Why a second GEMV beside triton_gemv.py: at one row the product is a pure
stream of weight bytes, and what decides its speed is how many bytes each SM
keeps in flight. The first kernel (triton_gemv.py) gave each thread one or two
words per loop step and reached 0.2-0.3 of the H200's copy bandwidth. Here a
program owns BLOCK_N rows and walks K in steps of GROUPS x 128 inputs with each
thread holding several 16-byte vectors of words per step (the sweep in
bench/int4_linear.py picks the tile per layer), so the loads of a step cover
4-16 KB per program.

Each thread computes the fp16x2 activation pairs of its own columns once and
reuses them for every row it holds (the 1024.0 trick and the fp16x2 dot of
triton_dequant.py do the rest: about two instructions per weight).

Like kernels/gemv.py for 16-bit weights, the kernel also folds in the glue
around the product (a launch and its gap cost as much as a small product):
- NORM: the input is rms_norm(h) * NW. Each program first sums the squares of
  h (a few KB, from L2), then forms the normalised input with the unfused
  path's rounding (normalise in fp32, round to h's dtype, times NW, round),
  so the 16-bit pairs never see the raw residual stream's range;
- EPILOGUE 1: residual add in place (Y[rows] += round(W x));
- EPILOGUE 2: SiLU·mul, W holding [gate; up] (2N rows): one program owns gate
  row j and up row j;
- SPLIT_K > 1: programs of a row block each take a share of K, write fp32
  partials, and the last to arrive (an atomic counter it resets) sums them
  and runs the epilogue: one launch, graph-safe.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial

import torch
import triton
import triton.language as tl

from nib.engine.kernels.gemv import (
    EPI_GLU,
    EPI_NONE,
    EPI_RESIDUAL,
    SplitBuffers,
    _epilogue,
)
from nib.engine.kernels.gemv import split_buffers as gemv_split_buffers
from nib.engine.quant.triton_dequant import dequant_pairs, dot8

log = logging.getLogger("nib.engine")


@dataclass(frozen=True)
class Int4GemvConfig:
    block_n: int  # output rows per program
    groups: int  # groups of 128 inputs per loop step
    num_warps: int
    split_k: int = 1
    # The norm as its own kernel (kernels/norm.py) before the GEMV, instead of inside it:
    # the fused norm converts the input per thread and step, which can cost more than a
    # launch where few rows share a thread's columns. Timing decides per layer.
    prenorm: bool = False

    def label(self) -> str:
        split = f"s{self.split_k}" if self.split_k > 1 else ""
        kernel = "rms_norm+gemv1" if self.prenorm else "gemv1"
        return f"int4 {kernel} {self.block_n}x{self.groups * 128}w{self.num_warps}{split}"


# Tried per layer shape at start-up, with bench/int4_linear.py's winner for the shape
# (tuned.json); kept short: each compiles once per shape and fusion.
CANDIDATES = (
    Int4GemvConfig(8, 8, 4),
    Int4GemvConfig(16, 8, 4),
    Int4GemvConfig(4, 8, 4),
    Int4GemvConfig(16, 4, 4),
    Int4GemvConfig(8, 16, 4),
    Int4GemvConfig(4, 16, 4),
    Int4GemvConfig(32, 4, 8),
    # Few output rows over a long K (o_proj, down_proj): more programs in flight.
    Int4GemvConfig(8, 8, 4, 2),
    Int4GemvConfig(8, 4, 4, 4),
)
# What bench/int4_linear.py tries beyond those.
SWEEP = (
    *CANDIDATES,
    Int4GemvConfig(8, 4, 4),
    Int4GemvConfig(2, 16, 2),
    Int4GemvConfig(4, 32, 4),
    Int4GemvConfig(2, 32, 4),
    Int4GemvConfig(8, 16, 8),
    Int4GemvConfig(16, 16, 8),
    Int4GemvConfig(16, 8, 8),
    Int4GemvConfig(4, 8, 2),
    Int4GemvConfig(16, 4, 4, 4),
    Int4GemvConfig(4, 16, 4, 2),
)
DEFAULT = Int4GemvConfig(16, 4, 4)


@triton.jit
def _x_pairs(X, X32, NW, word, ok, inv, NORM: tl.constexpr, PAIRS: tl.constexpr):
    """The four activation pairs of each word (inputs 8w + 2J, 8w + 2J + 1, J = 0..3) as
    fp16x2 in int32 tensors shaped like `word`; normalised as the unfused path rounds
    them (NORM: normalise in fp32, round to X's dtype, times NW, round)."""
    if PAIRS:  # fp16 input used as is: a word's four pairs are one 16-byte load
        idx = word[:, :, None] * 4 + tl.arange(0, 4)[None, None, :]
        pairs = tl.load(X32 + idx, mask=ok[:, :, None], other=0)
        even, odd = tl.split(tl.reshape(pairs, (word.shape[0], word.shape[1], 2, 2)))
        x0, x2 = tl.split(even)
        x1, x3 = tl.split(odd)
    else:
        # A word's 8 inputs are 16 contiguous bytes: one vector load, then split in pairs.
        idx = word[:, :, None] * 8 + tl.arange(0, 8)[None, None, :]
        v = tl.load(X + idx, mask=ok[:, :, None], other=0.0)
        if NORM:
            dtype = X.dtype.element_ty
            v = (v.to(tl.float32) * inv).to(dtype).to(tl.float32)
            nw = tl.load(NW + idx, mask=ok[:, :, None], other=0.0).to(tl.float32)
            v = (v * nw).to(dtype)
        bits = v.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
        lo, hi = tl.split(tl.reshape(bits, (word.shape[0], word.shape[1], 4, 2)))
        pairs = lo | (hi << 16)  # [.., .., 4]: pair J
        even, odd = tl.split(tl.reshape(pairs, (word.shape[0], word.shape[1], 2, 2)))
        x0, x2 = tl.split(even)
        x1, x3 = tl.split(odd)
    return x0, x1, x2, x3


@triton.jit
def _load_tile(QW, S, rows, row_ok, g, g_ok, kw, stride_s):
    """The words [BLOCK_N, G, 16] of groups g of these rows, and their scales [BLOCK_N, G]."""
    word = g[:, None] * 16 + tl.arange(0, 16)[None, :]
    mask = row_ok[:, None, None] & g_ok[None, :, None]
    words = tl.load(QW + rows[:, None, None] * kw + word[None, :, :], mask=mask, other=0)
    scale = tl.load(
        S + g[None, :] * stride_s + rows[:, None], mask=row_ok[:, None] & g_ok[None, :], other=0.0
    )
    return words, scale


@triton.jit
def _tile_dot(words, scale, x0, x1, x2, x3, USE_ASM: tl.constexpr):
    """fp32 [BLOCK_N, G, 16]: each word's 8 products, scaled by its group's scale."""
    p0, p1, p2, p3 = dequant_pairs(words, USE_ASM)
    part = dot8(
        p0, p1, p2, p3, x0[None, :, :], x1[None, :, :], x2[None, :, :], x3[None, :, :], USE_ASM
    )
    return part * scale.to(tl.float32)[:, :, None]


@triton.jit
def int4_gemv_kernel(
    X, X32, QW, S, B, Y, NW, WS, LOCK,
    N, stride_s, eps,
    K: tl.constexpr, STEPS: tl.constexpr, HAS_BIAS: tl.constexpr, NORM: tl.constexpr,
    EPILOGUE: tl.constexpr, PAIRS: tl.constexpr, BLOCK_N: tl.constexpr, GROUPS: tl.constexpr, SPLIT_K: tl.constexpr,
    USE_ASM: tl.constexpr, NORM_BLOCK: tl.constexpr,
):  # fmt: skip
    """Y = W x (+ B) for one row x of K inputs; W int32 [N (2N for GLU), K // 8] in
    layout.py's order, S fp16 [K // 128, stride_s]. STEPS loop steps per split (constants:
    static trip counts)."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    dtype = X.dtype.element_ty
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    kw = K // 8
    n_groups = K // 128
    rg = tl.arange(0, GROUPS)
    rw = tl.arange(0, 16)
    # Registers double-buffer the weights: step i + 1's tile is loaded before step i's
    # is multiplied, so each thread keeps two steps of words in flight.
    g = pid_k * STEPS * GROUPS + rg  # [G] groups of step 0
    g_ok = g < n_groups
    words, scale = _load_tile(QW, S, rows, row_ok, g, g_ok, kw, stride_s)
    words_up, scale_up = words, scale
    if EPILOGUE == 2:
        words_up, scale_up = _load_tile(QW, S, rows + N, row_ok, g, g_ok, kw, stride_s)
    inv = 1.0
    if NORM:  # the squares of h: a few KB from L2, while step 0's weights are on the way
        sq = tl.zeros((NORM_BLOCK,), tl.float32)
        for k0 in range(0, K, NORM_BLOCK):
            cols = k0 + tl.arange(0, NORM_BLOCK)
            h = tl.load(X + cols, mask=cols < K, other=0.0).to(tl.float32)
            sq += h * h
        inv = 1.0 / tl.sqrt(tl.sum(sq, axis=0) / K + eps)
    acc = tl.zeros((BLOCK_N, GROUPS, 16), tl.float32)
    acc_up = tl.zeros((BLOCK_N, GROUPS, 16), tl.float32)
    for i in range(0, STEPS):
        g_next = g + GROUPS
        next_ok = (g_next < n_groups) & (i + 1 < STEPS)
        words_next, scale_next = _load_tile(QW, S, rows, row_ok, g_next, next_ok, kw, stride_s)
        words_up_next, scale_up_next = words_next, scale_next
        if EPILOGUE == 2:
            words_up_next, scale_up_next = _load_tile(
                QW, S, rows + N, row_ok, g_next, next_ok, kw, stride_s
            )
        word = g[:, None] * 16 + rw[None, :]  # [G, 16] word index along K
        ok = g_ok[:, None] & (rw[None, :] < 16)
        x0, x1, x2, x3 = _x_pairs(X, X32, NW, word, ok, inv, NORM, PAIRS)
        acc += _tile_dot(words, scale, x0, x1, x2, x3, USE_ASM)
        if EPILOGUE == 2:
            acc_up += _tile_dot(words_up, scale_up, x0, x1, x2, x3, USE_ASM)
        g, g_ok = g_next, next_ok
        words, scale = words_next, scale_next
        words_up, scale_up = words_up_next, scale_up_next
    y = tl.sum(tl.sum(acc, axis=2), axis=1)
    y_up = tl.sum(tl.sum(acc_up, axis=2), axis=1)
    if SPLIT_K == 1:
        _epilogue(y, y_up, rows, row_ok, B, Y, dtype, HAS_BIAS, EPILOGUE)
    else:
        # WS: [SPLIT_K, 2 * N] fp32 partials (gate or plain, then up).
        base = WS + pid_k * 2 * N
        tl.store(base + rows, y, mask=row_ok)
        if EPILOGUE == 2:
            tl.store(base + N + rows, y_up, mask=row_ok)
        tl.debug_barrier()
        arrived = tl.atomic_add(LOCK + pid_n, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT_K - 1:
            y = tl.zeros((BLOCK_N,), tl.float32)
            y_up = tl.zeros((BLOCK_N,), tl.float32)
            for s in range(SPLIT_K):
                part = WS + s * 2 * N
                y += tl.load(part + rows, mask=row_ok, other=0.0, cache_modifier=".cg")
                if EPILOGUE == 2:
                    y_up += tl.load(part + N + rows, mask=row_ok, other=0.0, cache_modifier=".cg")
            _epilogue(y, y_up, rows, row_ok, B, Y, dtype, HAS_BIAS, EPILOGUE)
            tl.atomic_xchg(LOCK + pid_n, 0, sem="relaxed", scope="gpu")


def split_buffers(n: int, cfg: Int4GemvConfig, device: torch.device) -> SplitBuffers | None:
    """One layer's split-K workspace (plain/gate and up partials) and counters, as
    kernels/gemv.py allocates them (None without split)."""
    return gemv_split_buffers(n, cfg, device, parts=2)


def _steps(k: int, cfg: Int4GemvConfig) -> int:
    return triton.cdiv(triton.cdiv(k // 128, cfg.groups), cfg.split_k)


def launch(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    n: int,
    cfg: Int4GemvConfig,
    norm_weight: torch.Tensor | None = None,
    eps: float = 0.0,
    epilogue: int = EPI_NONE,
    buffers: SplitBuffers | None = None,
    use_asm: bool = True,
) -> None:
    """out[:n] = (epilogue of) W x: x holds one row of K (fp16 or bf16), contiguous."""
    k = qweight.shape[1] * 8
    if x.numel() != k or not x.is_contiguous():
        raise ValueError(f"int4 gemv: x must be one contiguous row of {k} inputs")
    if cfg.split_k > 1 and buffers is None:
        buffers = split_buffers(n, cfg, x.device)  # one-off call (tests, tuning)
    ws, lock = buffers if buffers is not None else (scales, scales)
    x = x.reshape(k)
    pairs = x.dtype == torch.float16 and norm_weight is None
    int4_gemv_kernel[(triton.cdiv(n, cfg.block_n), cfg.split_k)](
        x, x.view(torch.int32) if pairs else x, qweight, scales,
        bias if bias is not None else scales, out,
        norm_weight if norm_weight is not None else x, ws, lock,
        n, scales.stride(0), eps, K=k, STEPS=_steps(k, cfg),
        HAS_BIAS=bias is not None, NORM=norm_weight is not None, EPILOGUE=epilogue,
        PAIRS=pairs, BLOCK_N=cfg.block_n, GROUPS=cfg.groups, SPLIT_K=cfg.split_k,
        USE_ASM=use_asm, NORM_BLOCK=1024, num_warps=cfg.num_warps,
    )  # fmt: skip


def gemv(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    bias: torch.Tensor | None,
    cfg: Int4GemvConfig,
    buffers: SplitBuffers | None = None,
    use_asm: bool = True,
) -> torch.Tensor:
    """x [..., K] holding one row -> [..., N] in x's dtype."""
    n = qweight.shape[0]
    y = torch.empty(n, dtype=x.dtype, device=x.device)
    launch(x.contiguous(), qweight, scales, bias, y, n, cfg, buffers=buffers, use_asm=use_asm)
    return y.view(*x.shape[:-1], n)


def norm_gemv(
    h: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    bias: torch.Tensor | None,
    cfg: Int4GemvConfig,
    glu: bool = False,
    buffers: SplitBuffers | None = None,
    use_asm: bool = True,
) -> torch.Tensor:
    """W rms_norm(h) (+ b) in one kernel; with glu, W is [gate; up] and the result is
    silu(gate) * up. h [..., K] holds one row."""
    n = qweight.shape[0] // 2 if glu else qweight.shape[0]
    if glu and bias is not None:
        raise ValueError("norm_gemv: the GLU epilogue takes no bias")
    y = torch.empty(n, dtype=h.dtype, device=h.device)
    if cfg.prenorm:
        from nib.engine.kernels.norm import rms_norm

        xn = rms_norm(h.reshape(1, -1), norm_weight, eps)
        epilogue = EPI_GLU if glu else EPI_NONE
        launch(
            xn,
            qweight,
            scales,
            bias,
            y,
            n,
            cfg,
            epilogue=epilogue,
            buffers=buffers,
            use_asm=use_asm,
        )
        return y.view(*h.shape[:-1], n)
    launch(
        h.contiguous(), qweight, scales, bias, y, n, cfg, norm_weight, eps,
        EPI_GLU if glu else EPI_NONE, buffers, use_asm,
    )  # fmt: skip
    return y.view(*h.shape[:-1], n)


def gemv_residual(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    bias: torch.Tensor | None,
    residual: torch.Tensor,
    cfg: Int4GemvConfig,
    buffers: SplitBuffers | None = None,
    use_asm: bool = True,
) -> None:
    """residual += W x (+ b), in place, in one kernel (x and residual hold one row)."""
    n = qweight.shape[0]
    if not residual.is_contiguous() or residual.numel() != n:
        raise ValueError("gemv_residual: residual must be one contiguous row of the output size")
    launch(
        x.contiguous(), qweight, scales, bias, residual, n, cfg,
        epilogue=EPI_RESIDUAL, buffers=buffers, use_asm=use_asm,
    )  # fmt: skip


def fused_call(
    fusion: str,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    bias: torch.Tensor | None,
    cfg: Int4GemvConfig,
    x: torch.Tensor,
    scratch: torch.Tensor,
) -> Callable[[], object]:
    """One call of the kernel variant `fusion` ("" for the plain product), for timing."""
    glu = fusion == "norm_glu"
    n = qweight.shape[0] // 2 if glu else qweight.shape[0]
    buffers = split_buffers(n, cfg, x.device)
    if fusion == "residual":
        return partial(gemv_residual, x, qweight, scales, bias, scratch[:n], cfg, buffers)
    if fusion in ("norm", "norm_glu"):
        nw = torch.ones(x.numel(), dtype=x.dtype, device=x.device)
        return partial(norm_gemv, x, nw, 1e-6, qweight, scales, bias, cfg, glu, buffers)
    return partial(gemv, x, qweight, scales, bias, cfg, buffers)


def tuned() -> dict[tuple[int, int], Int4GemvConfig]:
    """bench/int4_linear.py's fastest one-row tiles per (out, in), from tuned.json."""
    from nib.engine.quant.kernels import TUNED_FILE

    if not TUNED_FILE.is_file():
        return {}
    raw = json.loads(TUNED_FILE.read_text()).get("gemv1", [])
    return {(e["n"], e["k"]): Int4GemvConfig(**e["config"]) for e in raw}


def _best(calls: dict[Int4GemvConfig | None, list[Callable[[], object]]]) -> Int4GemvConfig | None:
    """The config whose calls (every layer of a shape, in turn) time fastest; a config
    that fails to compile or launch on this GPU is left out."""
    from nib.engine.kernels.gemv import _time_layers

    timed: list[tuple[float, int, Int4GemvConfig | None]] = []
    for i, (cfg, fns) in enumerate(calls.items()):
        try:
            timed.append((_time_layers(fns), i, cfg))
        except Exception:  # a tile this GPU cannot run is not a candidate
            log.warning("int4 gemv %s failed here; not a candidate", cfg, exc_info=True)
    if not timed:
        raise RuntimeError("no INT4 GEMV configuration runs on this GPU")
    return min(timed)[2]


def swap_in_int4_gemv(
    model: torch.nn.Module, tune: bool = True, fuse: bool = True
) -> dict[tuple[int, int], str]:
    """Give every Int4Linear the batch-1 GEMV: per (out, in) shape the fastest of the
    general INT4 kernels and the candidate tiles for the plain product, and (fuse) per
    (shape, fusion) the fastest tiles of the fused kernel, timed over all layers of the
    shape. Returns {(out, in): chosen one-row kernel}."""
    from nib.engine.kernels.gemv import fusion_of
    from nib.engine.quant.kernels import int4_linear
    from nib.engine.quant.linear import Int4Linear

    mods = [
        (n, m)
        for n, m in model.named_modules()
        if isinstance(m, Int4Linear) and m.cuda is None  # not on the CUDA kernel already
    ]
    by_shape: dict[tuple[int, int], list[tuple[str, Int4Linear]]] = {}
    for name, m in mods:
        by_shape.setdefault((m.out_features, m.in_features), []).append((name, m))
    labels: dict[tuple[int, int], str] = {}
    dtype = next(model.parameters()).dtype
    winners = tuned() if tune else {}
    for shape, group in by_shape.items():
        device = group[0][1].qweight.device
        x = torch.randn(shape[1], device=device, dtype=dtype)
        scratch = torch.zeros(shape[0], device=device, dtype=dtype)
        fusions = {fusion_of(n) for n, _ in group} - {""} if fuse else set()
        plain: Int4GemvConfig | None = DEFAULT
        fused: dict[str, Int4GemvConfig | None] = dict.fromkeys(fusions, DEFAULT)
        if tune:
            calls: dict[Int4GemvConfig | None, list[Callable[[], object]]] = {
                None: [partial(int4_linear, x[None], m.qweight, m.scales, m.bias) for _, m in group]
            }
            winner = winners.get(shape)
            candidates = tuple(dict.fromkeys((*CANDIDATES, *([winner] if winner else []))))
            for cfg in candidates:
                calls[cfg] = [
                    fused_call("", m.qweight, m.scales, m.bias, cfg, x, scratch) for _, m in group
                ]
            plain = _best(calls)
            for fusion in fusions:
                members = [m for n, m in group if fusion_of(n) == fusion]
                tried = candidates
                if fusion.startswith("norm"):
                    tried += tuple(replace(c, prenorm=True) for c in candidates)
                fused[fusion] = _best(
                    {
                        cfg: [
                            fused_call(fusion, m.qweight, m.scales, m.bias, cfg, x, scratch)
                            for m in members
                        ]
                        for cfg in tried
                    }
                )
        for name, m in group:
            fusion = fusion_of(name) if fuse else ""
            m.use_gemv(plain, fusion, fused.get(fusion))
        labels[shape] = group[0][1].kernel(1) or "int4 general"
    return labels
