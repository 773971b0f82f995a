"""Bringing the engine up on a GPU, and what it reports about that once.

Order on CUDA: check the compute capability (refuse, or take the reference path
when allowed); swap in the fused Triton glue and the tuned GEMV; build the graph
runner (its attention and sampler objects); run the kernel self-check on exactly
those objects and refuse to serve if any kernel is wrong; only then capture the
graphs, measure their memory pool and record which kernel runs each layer.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import torch

from nib.engine import versions
from nib.engine.kernel_paths import compact, engine_rows, gpu_paths, reference_paths
from nib.engine.memory import graph_pool_usage
from nib.engine.quant.linear import Int4Linear
from nib.engine.selfcheck import SelfCheckFailed, SelfCheckReport, SelfCheckStatus, run_self_check

if TYPE_CHECKING:
    from nib.engine.engine import Engine

log = logging.getLogger("nib.engine")

# The kernels whose fallbacks are counted (a bounded label set for metrics).
GPU_KERNELS = (
    "rms_norm",
    "rope_cache",
    "silu_mul",
    "decode_attention",
    "gemv",
    "int4_gemv",
    "int4_mma",
    "int4_dequant",
    "int4_mma16",
    "exp_noise",
)


def setup_gpu(engine: Engine) -> None:
    from nib.engine.graphs import GraphRunner
    from nib.engine.ops import TritonOps
    from nib.engine.selfcheck_cases import build_cases

    model, config, device = engine.model, engine.config, engine.device
    assert model is not None
    props = torch.cuda.get_device_properties(device)
    if not versions.kernels_supported(
        (props.major, props.minor),
        props.name,
        allow_reference_fallback=config.allow_reference_fallback,
    ):
        use_reference_path(engine, f"{props.name} is sm_{props.major}{props.minor}")
        return
    engine.kernel_mode = "triton"
    model.ops = TritonOps()
    started = time.perf_counter()
    engine.gemv_choices = swap_in_linear_kernels(model, device, tune=config.tune_kernels)
    log.info("linear kernels per (out, in): %s", engine.gemv_choices)
    runner = GraphRunner(
        model,
        engine.max_context,
        use_graphs=config.use_graphs,
        on_fallback=engine.stats.record_graph_fallback,
    )
    engine.runner = runner
    if config.tune_kernels and config.use_graphs:
        from nib.engine.step_tuning import tune_step

        tune_step(runner)  # configs timed in the decode step itself (runner.step_tuning)
    # The cases (and the reference weights they build) are gone once the check returns.
    report = run_self_check(
        build_cases(
            model,
            engine_rows(runner),
            runner.attention,
            runner.chunk_attention,
            runner.fused_attention,
            runner.fuse_pick and runner.pick_fusable(),
        ),
        engine.hooks.tamper_selfcheck,
    )
    engine.selfcheck = report
    if report.status is SelfCheckStatus.FAILED:
        raise SelfCheckFailed(report)
    log.info("kernel self-check: %s", report.summary())
    torch.cuda.empty_cache()  # the check's scratch memory goes back before capture
    reserved = torch.cuda.memory_reserved(device)
    runner.capture()
    engine.graph_pool = graph_pool_usage(
        device, runner.pool, torch.cuda.memory_reserved(device) - reserved
    )
    if runner.measure_step_costs():  # what a verify step costs: does drafting pay here?
        log.info(
            "step costs: decode %.0f us, verify %s decode steps",
            runner.step_us[1],
            {b: round(c, 2) for b, c in runner.verify_costs.items()},
        )
    engine.kernel_paths = gpu_paths(model, runner)
    captured = sum(s.ready for s in runner.states.values())
    log.info(
        "captured %d/%d CUDA graphs in %.1fs (incl. kernel tuning and self-check); "
        "graph pool %d bytes (%s)",
        captured,
        len(runner.states),
        time.perf_counter() - started,
        engine.graph_pool.reserved if engine.graph_pool else 0,
        engine.graph_pool.method if engine.graph_pool else "no graphs",
    )


def swap_in_linear_kernels(
    model: torch.nn.Module, device: torch.device, tune: bool = True
) -> dict[tuple[int, int], str]:
    """Put the fastest batch-1 kernels under every linear layer: the tuned 16-bit GEMV, and
    for INT4 layers nib's CUDA tensor-core kernel where it can run here (else, and for
    shapes it cannot hold, the Triton INT4 kernels). Returns {(out, in): kernel label}."""
    from nib.engine.kernels.gemv import swap_in_gemv

    choices = swap_in_gemv(model, tune=tune)
    if any(isinstance(m, Int4Linear) for m in model.modules()):
        from nib.engine.cuda.loader import unavailable_reason

        if not unavailable_reason(device):
            from nib.engine.cuda.int4_swap import swap_in_cuda_int4

            choices.update(swap_in_cuda_int4(model, tune=tune))
        if any(isinstance(m, Int4Linear) and m.cuda is None for m in model.modules()):
            from nib.engine.quant.fused_gemv import swap_in_int4_gemv

            choices.update(swap_in_int4_gemv(model, tune=tune))
    return choices


def use_reference_path(engine: Engine, why: str) -> None:
    """The PyTorch reference on the GPU: eager, no Triton, no graphs."""
    assert engine.model is not None
    engine.kernel_mode = "reference"
    for module in engine.model.modules():
        if isinstance(module, Int4Linear):
            module.use_reference = True
    engine.selfcheck = SelfCheckReport(
        SelfCheckStatus.NOT_RUN,
        f"reference path ({why}, below the kernels' floor; --allow-reference-fallback)",
    )
    engine.kernel_paths = reference_paths(engine.model, fallback=True)


def kernel_fallbacks(mode: str) -> dict[str, int]:
    """Fallbacks to a slower path per kernel; empty (absent) where no kernel runs."""
    if mode == "reference":
        return dict.fromkeys(GPU_KERNELS, 1)
    if mode != "triton":
        return {}
    from nib.engine.quant.kernels import FALLBACK_COUNTS

    return {**dict.fromkeys(GPU_KERNELS, 0), **FALLBACK_COUNTS}


def startup_record(engine: Engine) -> dict[str, Any]:
    """The one start-up report, logged when the engine is ready."""
    runner = engine.runner
    graphs = runner.states.values() if runner else ()
    return {
        "versions": asdict(engine.versions),
        "kernel_mode": engine.kernel_mode,
        "step_tuning": engine.step_choices,
        "self_check": engine.selfcheck.summary(),
        "graphs_captured": sum(s.ready for s in graphs),
        "graphs_eager": sorted(s.name for s in graphs if not s.ready),
        "graph_pool_bytes": engine.graph_pool.reserved if engine.graph_pool else None,
        "verify_costs": {str(b): round(c, 3) for b, c in runner.verify_costs.items()}
        if runner
        else {},
        "kernel_paths": {
            f"{p.layer} {p.op} rows={p.rows}": p.kernel
            + (f" [{p.graphs}]" if p.graphs else "")
            + (" (FALLBACK)" if p.fallback else "")
            for p in compact(engine.kernel_paths)
        },
    }
