"""Launching the INT4 kernels: configurations, the per-shape choice, and split-K workspace.

Three paths, all reading the same packed weight (layout.py):
- "gemv": triton_gemv.py, CUDA cores, for decode (M = 1) and tiny M;
- "mma": triton_mma.py, tensor cores, for M = 2..16 and, with larger tiles, prefill;
- "dequant": dequantise to an fp16 scratch weight, then cuBLAS (prefill).

Which path and block sizes run for a shape comes from `choose()`: a measured
table (tuned.json beside this file, written by bench/int4_linear.py
--write-tuned) where one exists for the shape, else a rule of thumb.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger("nib.engine")

TUNED_FILE = Path(__file__).resolve().parent / "tuned.json"
MAX_SPLIT_K = 16


@dataclass(frozen=True)
class KernelConfig:
    """One way to run the product; fields not used by a path are ignored by it."""

    path: str = "gemv"  # gemv | mma | dequant
    block_m: int = 1
    block_n: int = 8
    groups: int = 2  # gemv: groups of 128 inputs per loop step
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 2
    asm: bool = True

    def __post_init__(self) -> None:
        if self.path not in ("gemv", "mma", "dequant"):
            raise ValueError(f"path {self.path!r} is not gemv, mma or dequant")
        if not 1 <= self.split_k <= MAX_SPLIT_K:
            raise ValueError(f"split_k must be in 1..{MAX_SPLIT_K}")

    def label(self) -> str:
        if self.path == "dequant":
            return "dequant+cublas"
        tail = f"g{self.groups}" if self.path == "gemv" else ""
        return (
            f"{self.path} m{self.block_m} n{self.block_n}{tail} s{self.split_k} "
            f"w{self.num_warps} st{self.num_stages} {'asm' if self.asm else 'tl'}"
        )


@dataclass(frozen=True)
class TunedEntry:
    n: int
    k: int
    m_max: int
    config: KernelConfig = field(default_factory=KernelConfig)


@cache
def _tuned_table() -> tuple[TunedEntry, ...]:
    if not TUNED_FILE.is_file():
        return ()
    raw: list[dict[str, Any]] = json.loads(TUNED_FILE.read_text())["entries"]
    return tuple(
        TunedEntry(e["n"], e["k"], e["m_max"], KernelConfig(**e["config"]))
        for e in sorted(raw, key=lambda e: e["m_max"])
    )


def tuned_entries_json(entries: list[TunedEntry]) -> str:
    """The tuned.json text for these entries (what the benchmark writes)."""
    body = [{"n": e.n, "k": e.k, "m_max": e.m_max, "config": asdict(e.config)} for e in entries]
    return json.dumps({"entries": body}, indent=1) + "\n"


def default_config(m: int, n: int, k: int) -> KernelConfig:
    """Rule of thumb before measurement: GEMV for decode, tensor cores up to 16, cuBLAS after."""
    if m == 1:
        # Enough row blocks to fill 132 SMs several times; split K when there are few rows.
        block_n = 8 if n >= 8192 else 4
        blocks = -(-n // block_n)
        split = 1 if blocks >= 528 else min(4, max(1, (k // 128) // 8))
        return KernelConfig("gemv", 1, block_n, 2, split, 4, 2, True)
    if m <= 16:
        return KernelConfig("mma", 16, 64, 1, 1, 4, 3, True)
    return KernelConfig("dequant")


def choose(m: int, n: int, k: int) -> KernelConfig:
    for entry in _tuned_table():
        if entry.n == n and entry.k == k and m <= entry.m_max:
            return entry.config
    return default_config(m, n, k)


_WORKSPACE: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}


def _workspace(device: torch.device, floats: int, locks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Split-K scratch shared by all layers on a device (they run one after another)."""
    ws, lk = _WORKSPACE.get(device, (None, None))
    if ws is None or lk is None or ws.numel() < floats or lk.numel() < locks:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                "INT4 split-K workspace must be allocated before CUDA graph capture: "
                "run the model once eagerly first"
            )
        floats = max(floats, 0 if ws is None else ws.numel())
        locks = max(locks, 0 if lk is None else lk.numel())
        ws = torch.empty(floats, dtype=torch.float32, device=device)
        lk = torch.zeros(locks, dtype=torch.int32, device=device)
        _WORKSPACE[device] = (ws, lk)
    return ws, lk


def run(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    bias: torch.Tensor | None,
    config: KernelConfig,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """x fp16 [M, K] contiguous -> fp16 [M, N] with the given configuration."""
    import triton

    from nib.engine.quant.triton_dequant import dequant_kernel
    from nib.engine.quant.triton_gemv import gemv_kernel
    from nib.engine.quant.triton_mma import mma_kernel

    m, k = x.shape
    n = qweight.shape[0]
    if out is None:
        out = torch.empty((m, n), dtype=torch.float16, device=x.device)
    c = config
    if c.path == "dequant":
        w = torch.empty((n, k), dtype=torch.float16, device=x.device)
        dequant_kernel[(triton.cdiv(n, 32), k // 128)](
            qweight, scales, w, n, k, BLOCK_N=32, USE_ASM=c.asm, num_warps=4
        )
        torch.matmul(x, w.t(), out=out)
        if bias is not None:
            out += bias
        return out
    has_bias = bias is not None
    b = bias if bias is not None else scales
    n_blocks = triton.cdiv(n, c.block_n)
    m_blocks = triton.cdiv(m, c.block_m)
    ws, locks = scales, scales
    if c.split_k > 1:
        ws, locks = _workspace(x.device, c.split_k * m * n, n_blocks * m_blocks)
    if c.path == "gemv":
        if m > c.block_m:
            raise ValueError(f"gemv config has block_m={c.block_m} < M={m}")
        gemv_kernel[(n_blocks, c.split_k)](
            x.view(torch.int32), qweight, scales, b, out, ws, locks,
            m, n, k, x.stride(0) // 2, out.stride(0),
            BLOCK_M=c.block_m, BLOCK_N=c.block_n, GROUPS=c.groups, SPLIT_K=c.split_k,
            STEPS=triton.cdiv(triton.cdiv(k // 128, c.groups), c.split_k),
            HAS_BIAS=has_bias, USE_ASM=c.asm, num_warps=c.num_warps, num_stages=c.num_stages,
        )  # fmt: skip
    else:
        mma_kernel[(n_blocks, m_blocks, c.split_k)](
            x, qweight, scales, b, out, ws, locks,
            m, n, k, x.stride(0), out.stride(0),
            BLOCK_M=c.block_m, BLOCK_N=c.block_n, SPLIT_K=c.split_k,
            STEPS=triton.cdiv(k // 128, c.split_k),
            HAS_BIAS=has_bias, USE_ASM=c.asm, num_warps=c.num_warps, num_stages=c.num_stages,
        )  # fmt: skip
    return out


# A configuration that failed to compile or launch here -> the one used instead.
_FALLBACK: dict[KernelConfig, KernelConfig] = {}
# Times a kernel path failed here and the next one was tried, by "int4_<path>" of the
# one that failed (process-wide, like _FALLBACK; read by the engine's metrics).
FALLBACK_COUNTS: dict[str, int] = {}


def active_config(m: int, n: int, k: int) -> tuple[KernelConfig, bool]:
    """The configuration an [m, k] x [k, n] product runs with here, and whether it is a
    fallback from the chosen one (which failed on this GPU)."""
    chosen = choose(m, n, k)
    used = _FALLBACK.get(chosen, chosen)
    return used, used != chosen


def _fallbacks(config: KernelConfig) -> list[KernelConfig]:
    """What to try if config fails on this GPU: the pure-Triton dequant, then dequant + cuBLAS."""
    out = [config]
    if config.asm and config.path != "dequant":
        out.append(KernelConfig(**{**asdict(config), "asm": False}))
    out.append(KernelConfig("dequant", asm=False))
    return out


def int4_linear(
    x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """Int4Linear's CUDA forward: x [..., K] (any float dtype) -> [..., N] in x's dtype."""
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    x16 = x2.to(torch.float16).contiguous()
    b16 = None if bias is None else bias.to(torch.float16)
    chosen = choose(x16.shape[0], qweight.shape[0], x16.shape[1])
    config = _FALLBACK.get(chosen, chosen)
    for i, candidate in enumerate(_fallbacks(config)):
        try:
            out = run(x16, qweight, scales, b16, candidate)
        except Exception:
            if i == len(_fallbacks(config)) - 1 or torch.cuda.is_current_stream_capturing():
                raise
            key = f"int4_{candidate.path}"
            FALLBACK_COUNTS[key] = FALLBACK_COUNTS.get(key, 0) + 1
            log.warning(
                "INT4 kernel %s failed here; trying the next path", candidate.label(), exc_info=True
            )
            continue
        if candidate != config:
            _FALLBACK[chosen] = candidate
        break
    return out.to(x.dtype).view(*shape[:-1], qweight.shape[0])


def candidates(m: int) -> list[KernelConfig]:
    """The configurations bench/int4_linear.py tries for a shape (kept short: each compiles)."""
    if m == 1:
        return [
            KernelConfig("gemv", 1, 4, 2, 1, 4, 2, True),
            KernelConfig("gemv", 1, 8, 2, 1, 4, 2, True),
            KernelConfig("gemv", 1, 16, 1, 1, 4, 2, True),
            KernelConfig("gemv", 1, 8, 4, 1, 8, 2, True),
            KernelConfig("gemv", 1, 4, 2, 4, 4, 2, True),
            KernelConfig("gemv", 1, 8, 2, 1, 4, 2, False),
            KernelConfig("mma", 16, 32, 1, 1, 4, 2, True),
        ]
    if m <= 4:
        return [
            KernelConfig("gemv", 4, 8, 2, 1, 4, 2, True),
            KernelConfig("gemv", 4, 4, 2, 1, 4, 2, True),
            KernelConfig("mma", 16, 32, 1, 1, 4, 2, True),
            KernelConfig("mma", 16, 64, 1, 1, 4, 3, True),
            KernelConfig("mma", 16, 32, 1, 4, 4, 2, True),
        ]
    if m <= 16:
        return [
            KernelConfig("mma", 16, 32, 1, 1, 4, 2, True),
            KernelConfig("mma", 16, 64, 1, 1, 4, 3, True),
            KernelConfig("mma", 16, 128, 1, 1, 8, 3, True),
            KernelConfig("mma", 16, 32, 1, 4, 4, 2, True),
            KernelConfig("mma", 16, 64, 1, 1, 4, 3, False),
        ]
    return [
        KernelConfig("dequant"),
        KernelConfig("mma", 64, 128, 1, 1, 8, 3, True),
        KernelConfig("mma", 128, 128, 1, 1, 8, 3, True),
    ]
