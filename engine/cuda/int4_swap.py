"""Putting nib's CUDA INT4 kernel under every Int4Linear of a model, with tiles timed per shape.

Each layer is repacked once (w4a16.pack, gate/up interleaved where SiLU·mul is
fused) and keeps its Int4Linear; only the kernel behind it changes. Per
(out, in, fusion) the one-row tile shapes are timed on all layers of that
shape in turn (so weights come from memory, not L2), with the glue the decoder
fuses there, and the fastest is kept; cubins hold every shape, so this costs
no compilation. A layer the packing cannot hold (N not a multiple of 16) keeps
the Triton kernels.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial

import torch
from torch import nn

from nib.engine.cuda.timing import graph_us
from nib.engine.cuda.w4a16 import MULTI_ROW, ONE_ROW, CudaInt4, W4Config, runs_on
from nib.engine.quant.format import QuantShapeError
from nib.engine.quant.linear import Int4Linear
from nib.engine.step_tuning import STEP_CANDIDATES

log = logging.getLogger("nib.engine")

DEFAULT_ONE_ROW = W4Config(1, 4, 4, 1)
DEFAULT_MULTI_ROW = MULTI_ROW[0]
MULTI_ROWS_TUNED = 8  # a verify step's rows (1 + 7 drafted tokens)


def fused_call(
    packed: CudaInt4, cfg: W4Config, x: torch.Tensor, scratch: torch.Tensor
) -> Callable[[], object]:
    """One call of `packed`'s fused variant with tile config cfg, on x (one row) and a
    scratch residual of at least packed.n (for timing and profiling)."""
    packed.prepare(cfg, 1)
    if packed.fusion == "residual":
        return partial(packed.residual, x, scratch[: packed.n], cfg)
    if packed.fusion in ("norm", "norm_glu"):
        return partial(packed.norm, x, torch.ones_like(x), 1e-6, cfg)
    return partial(packed.linear, x, cfg)


def _worth_timing(p: CudaInt4, cfg: W4Config, sms: int) -> bool:
    """Split-K pays only where the row tiles alone leave SMs idle."""
    return cfg.splits == 1 or (p.tiles // cfg.r) < 4 * sms


def _ranked(
    group: list[CudaInt4], x: torch.Tensor, candidates: tuple[W4Config, ...], m: int
) -> list[W4Config]:
    """The candidates, fastest first, by the time their calls on every layer of the
    group take in turn inside a CUDA graph (m = 1: the group's fused variant; else the
    plain product of m rows)."""
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count
    scratch = torch.zeros(max(p.n for p in group), device=x.device, dtype=x.dtype)
    rows = x[None].expand(m, -1).to(torch.float16).contiguous() if m > 1 else x
    timed: list[tuple[float, int, W4Config]] = []
    seen: set[W4Config] = set()
    for i, cfg in enumerate(candidates):
        eff = group[0].effective(cfg, m)
        if eff in seen or not runs_on(eff, group[0].capability):
            continue
        if not _worth_timing(group[0], eff, sms):
            continue
        seen.add(eff)
        try:
            if m == 1:
                calls = [fused_call(p, eff, x, scratch) for p in group]
            else:
                calls = [partial(p.linear, rows, eff) for p in group]
            timed.append((graph_us(calls), i, eff))
        except Exception:  # a shape this GPU cannot run is not a candidate
            log.warning("int4 mma16 %s failed here; not a candidate", eff.label(), exc_info=True)
    if not timed:
        raise RuntimeError("no INT4 mma16 configuration runs on this GPU")
    return [cfg for _, _, cfg in sorted(timed)]


def swap_in_cuda_int4(
    model: nn.Module, tune: bool = True, fuse: bool = True
) -> dict[tuple[int, int], str]:
    """Give every Int4Linear whose shape fits the CUDA tensor-core kernel (engine/cuda/
    w4a16.py); returns {(out, in): one-row kernel label} for the layers that took it."""
    from nib.engine.kernels.gemv import fusion_of

    dtype = next(model.parameters()).dtype
    groups: dict[tuple[int, int, str], list[tuple[Int4Linear, CudaInt4]]] = {}
    for name, m in model.named_modules():
        if not isinstance(m, Int4Linear) or m.cuda is not None:
            continue
        fusion = fusion_of(name) if fuse else ""
        try:
            packed = CudaInt4(m.codes(), m.scales, m.bias, fusion, name, dtype)
        except QuantShapeError as exc:
            log.info("%s stays on the Triton INT4 kernels: %s", name, exc)
            continue
        groups.setdefault((m.out_features, m.in_features, fusion), []).append((m, packed))
    labels: dict[tuple[int, int], str] = {}
    for (n, k, _fusion), members in groups.items():
        packs = [p for _, p in members]
        device = packs[0].device
        x = torch.randn(k, device=device, dtype=dtype)
        ranked = _ranked(packs, x, ONE_ROW, 1) if tune else [DEFAULT_ONE_ROW]
        best = ranked[0]
        multi = DEFAULT_MULTI_ROW
        if tune:
            for p in packs:
                for cfg in MULTI_ROW:
                    p.prepare(p.effective(cfg, MULTI_ROWS_TUNED), MULTI_ROWS_TUNED)
            multi = _ranked(packs, x, MULTI_ROW, MULTI_ROWS_TUNED)[0]
        for m, p in members:
            # The runners-up, for the decode step's own timing (engine/step_tuning.py).
            p.one_row_candidates = ranked[:STEP_CANDIDATES]
            p.one_row = best
            p.multi_row = multi
            p.prepare(best, 1)
            for rows in (2, 16):  # one and two n8 tiles
                p.prepare(p.multi_row, rows)
            m.use_cuda(p)
        labels[(n, k)] = members[0][0].kernel(1) or ""
    torch.cuda.synchronize()
    return labels
