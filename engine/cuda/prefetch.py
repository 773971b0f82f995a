"""L2 prefetch along the decode step's chain of weight kernels (common.cuh `Prefetch`).

A batch-1 decode step runs its linear layers one after another, each waiting for
the previous one's output. Whatever a kernel does between its last weight load and
the next kernel's first (the dependency wait, staging the activations, reducing,
the tail of its last wave) leaves memory idle, and the small layers of a 1.5B model
are little else. So every weight kernel is handed byte ranges of the weights the
next layers will stream (the first `budget` bytes of that stream, in call order),
and its blocks prefetch them into L2 while they run: the next kernel then starts on
L2 hits instead of a DRAM round trip. A prefetch is a hint; it changes no result.
With `evict_first`, each kernel's own weight stream is marked evict-first in L2, so
that a long stream does not push out the prefetched lines before they are used.

Measured on the H200 (bench/l2_prefetch.py) it is worth 1-2% on some models and
costs 3% on others, so start-up's step tuning (engine/step_tuning.py) times the
decode step with and without it and keeps the faster. NIB_L2_PREFETCH_MB (0: off)
and NIB_L2_EVICT_FIRST (1 or 0) pin it instead. sm_90 only
(cp.async.bulk.prefetch); elsewhere the ranges are ignored.
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Sequence

from torch import nn

log = logging.getLogger(__name__)

RANGES = 4  # PF_RANGES in common.cuh
ALIGN = 256  # range lengths are rounded down to this (the kernel's shares are multiples)
DEFAULT_MB = 0.0  # off unless start-up's step tuning (step_tuning.py) finds it pays
Range = tuple[int, int]  # (device address, bytes)


class PrefetchArgs(ctypes.Structure):
    """common.cuh's `Prefetch`, the last member of the GEMV kernels' argument structs."""

    _fields_ = [
        ("ptr", ctypes.c_void_p * RANGES),
        ("bytes", ctypes.c_uint64 * RANGES),
        ("hint", ctypes.c_int),
    ]

    def ranges(self) -> list[Range]:
        return [(int(p or 0), int(n)) for p, n in zip(self.ptr, self.bytes, strict=True) if p]


NONE = PrefetchArgs()  # no prefetch, normal L2 policy


def make(ranges: Sequence[Range], evict_first: bool) -> PrefetchArgs:
    if len(ranges) > RANGES:
        raise ValueError(f"prefetch: at most {RANGES} ranges, got {len(ranges)}")
    args = PrefetchArgs()
    for i, (address, nbytes) in enumerate(ranges):
        if address % 16 or nbytes % 16 or nbytes <= 0:
            raise ValueError(
                f"prefetch: range {i} must be 16-byte aligned, got {address:#x}+{nbytes}"
            )
        args.ptr[i], args.bytes[i] = address, nbytes
    args.hint = int(evict_first)
    return args


def settings() -> tuple[int, bool]:
    """(budget in bytes, evict_first) from NIB_L2_PREFETCH_MB and NIB_L2_EVICT_FIRST."""
    raw = os.environ.get("NIB_L2_PREFETCH_MB", str(DEFAULT_MB))
    try:
        mb = float(raw)
    except ValueError:
        raise ValueError(f"NIB_L2_PREFETCH_MB must be a number of MB, got {raw!r}") from None
    if not 0 <= mb <= 1024:
        raise ValueError(f"NIB_L2_PREFETCH_MB must be between 0 and 1024, got {mb}")
    hint = os.environ.get("NIB_L2_EVICT_FIRST", "1")
    if hint not in ("0", "1"):
        raise ValueError(f"NIB_L2_EVICT_FIRST must be 0 or 1, got {hint!r}")
    return int(mb * 2**20), hint == "1"


def decode_order(model: nn.Module) -> list[nn.Module]:
    """The linear layers in the order a decode step calls them, the lm_head last."""
    order: list[nn.Module] = []
    for layer in model.layers:  # type: ignore[union-attr]
        attn, ffn = layer.attention, layer.feed_forward
        order += [attn.wqkv, attn.wo, ffn.w_gate_up, ffn.w_down]
    order.append(model.output)  # type: ignore[arg-type]
    return order


def weight_ranges(module: nn.Module) -> list[Range]:
    """The device memory a layer's batch-1 kernel streams, in the order it streams it."""
    from nib.engine.quant.linear import Int4Linear

    tensors = []
    if isinstance(module, Int4Linear):
        if module.cuda is not None:
            tensors = [module.cuda.qw, module.cuda.sc]
        else:
            tensors = [module.qweight, module.scales]
    elif getattr(module, "weight", None) is not None:
        tensors = [module.weight]
    return [
        (t.data_ptr(), t.numel() * t.element_size())
        for t in tensors
        if t.is_cuda and t.data_ptr() % 16 == 0
    ]


def upcoming(chain: Sequence[Sequence[Range]], i: int, budget: int) -> list[Range]:
    """The first `budget` bytes the layers after chain[i] stream (wrapping from the
    lm_head to the first layer, which the next step runs): whole layers while they
    fit, then the same fraction of each range of the next one; at most RANGES ranges."""
    out: list[Range] = []
    left = budget
    n = len(chain)
    for step in range(1, n):
        ranges = chain[(i + step) % n]
        total = sum(b for _, b in ranges)
        if not ranges or total == 0:
            continue
        frac = min(1.0, left / total)
        for address, nbytes in ranges:
            take = nbytes if frac >= 1.0 else int(nbytes * frac) // ALIGN * ALIGN
            if take > 0 and len(out) < RANGES:
                out.append((address, take))
                left -= take
        if frac < 1.0 or left < ALIGN or len(out) >= RANGES:
            break  # a layer taken in part ends the window
    return out


def chain_prefetch(
    model: nn.Module, budget: int | None = None, evict_first: bool | None = None
) -> int:
    """Give every layer's batch-1 kernel its prefetch ranges (`module.prefetch`).
    Defaults from settings(); budget 0 clears them. Returns the layers that prefetch."""
    env_budget, env_hint = settings()
    budget = env_budget if budget is None else budget
    evict_first = env_hint if evict_first is None else evict_first
    order = decode_order(model)
    chain = [weight_ranges(m) for m in order]
    linked = 0
    from nib.engine.quant.linear import Int4Linear

    for i, module in enumerate(order):
        ranges = upcoming(chain, i, budget) if budget > 0 else []
        args = make(ranges, evict_first) if ranges else NONE
        linked += bool(ranges)
        cuda = module.cuda if isinstance(module, Int4Linear) else None
        (cuda if cuda is not None else module).prefetch = args
    log.info(
        "l2 prefetch: %d layers, %.1f MB ahead, evict-first stream %s",
        linked, budget / 2**20, evict_first,
    )  # fmt: skip
    return linked
