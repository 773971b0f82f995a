"""Which kernel runs each layer, for which row counts, inside which graphs.

Logged once at start-up and exposed in model-info and the health detail, so a
silent fallback to a slow path (a kernel that failed to compile here and was
replaced, the reference path on an old GPU) is visible. Layers whose entries
agree are merged: `layers.0-31.attention.wqkv` stands for every layer in the range.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from torch import nn

from nib.engine.quant.linear import Int4Linear

if TYPE_CHECKING:
    from nib.engine.graphs import GraphRunner
    from nib.engine.model import Transformer

HEAD = "output"  # the lm_head's module name


@dataclass(frozen=True)
class KernelPath:
    layer: str  # module name, e.g. "layers.0-31.attention.wqkv" or "output"
    op: str  # linear, rms_norm, rope_cache, silu_mul, attention.*, sampling
    rows: str  # input rows this entry covers: "1", "2-16", "any"
    kernel: str  # e.g. "gemv-8x256w4", "cublas", "int4 gemv1 16x512w4 +norm", "torch"
    graphs: str = ""  # the graphs it runs in ("" on the CPU)
    fallback: bool = False  # a slower path than the one chosen for this GPU


def is_gemv(module: nn.Module) -> bool:
    gemv = sys.modules.get("nib.engine.kernels.gemv")  # no import: it needs triton
    return gemv is not None and isinstance(module, gemv.GemvLinear)


def linears(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    for name, m in model.named_modules():
        if isinstance(m, nn.Linear | Int4Linear) or is_gemv(m):
            yield name, m


def linear_kernel(module: nn.Module, rows: int) -> tuple[str, bool]:
    """(kernel, is a fallback) for an input of `rows` rows through this linear layer."""
    if isinstance(module, Int4Linear):
        if module.use_reference or module.qweight.device.type != "cuda":
            return "int4 reference (torch)", module.qweight.device.type == "cuda"
        batch1 = module.kernel(rows)
        if batch1 is not None:
            return batch1, False
        from nib.engine.quant.kernels import active_config

        config, fallback = active_config(rows, module.out_features, module.in_features)
        return f"int4 {config.label()}", fallback
    if is_gemv(module):
        kernel: str = module.kernel(rows)  # type: ignore[operator]
        return kernel, False
    return "torch linear", False


def _span(lo: int, hi: int) -> str:
    return str(lo) if lo == hi else f"{lo}-{hi}"


def row_classes(module: nn.Module, rows: Iterable[int]) -> list[tuple[int, int, str, bool]]:
    """Consecutive row counts that run the same kernel: [(lo, hi, kernel, fallback)]."""
    out: list[tuple[int, int, str, bool]] = []
    for r in sorted(set(rows)):
        kernel, fallback = linear_kernel(module, r)
        if out and out[-1][2:] == (kernel, fallback):
            out[-1] = (out[-1][0], r, kernel, fallback)
        else:
            out.append((r, r, kernel, fallback))
    return out


def engine_rows(runner: GraphRunner) -> tuple[int, ...]:
    """Every row count the GPU engine feeds its layers."""
    return tuple(sorted({1, *runner.verify_buckets, *runner.chunk_buckets, *runner.buckets}))


def _families(runner: GraphRunner, lo: int, hi: int, head: bool) -> str:
    """The graphs a layer runs in for rows in [lo, hi] (the lm_head sees one row per
    prefill or chunk: only the last position is projected)."""
    fams: dict[str, list[int]] = {}
    for r in sorted({1, *runner.verify_buckets, *runner.chunk_buckets, *runner.buckets}):
        if not lo <= r <= hi:
            continue
        if r == 1:
            fams["decode"] = []
            if head:
                fams["prefill"] = list(runner.buckets)
                fams["chunk"] = list(runner.chunk_buckets)
        if r in runner.verify_buckets:
            fams.setdefault("verify", []).append(r)
        if not head and r in runner.chunk_buckets:
            fams.setdefault("chunk", []).append(r)
        if not head and r in runner.buckets:
            fams.setdefault("prefill", []).append(r)
    return "; ".join(_family(fam, sizes) for fam, sizes in fams.items())


def _family(name: str, sizes: Iterable[int]) -> str:
    """decode, verify-4,8 or prefill-16..2048: a family of graphs and its buckets."""
    s = list(sizes)
    if not s:
        return name
    if len(s) <= 2:
        return f"{name}-{','.join(map(str, s))}"
    return f"{name}-{s[0]}..{s[-1]}"


def _all_layers(model: Transformer) -> str:
    n = len(model.layers)
    return "layers.0" if n == 1 else f"layers.0-{n - 1}"


def gpu_paths(model: Transformer, runner: GraphRunner) -> tuple[KernelPath, ...]:
    """The kernels of the Triton engine (tuned GEMV or cuBLAS, INT4 paths, fused glue)."""
    rows = engine_rows(runner)
    paths = []
    head_rows = tuple(sorted({1, *runner.verify_buckets}))  # the lm_head projects these only
    for name, m in linears(model):
        for lo, hi, kernel, fallback in row_classes(m, head_rows if name == HEAD else rows):
            graphs = _families(runner, lo, hi, head=name == HEAD)
            paths.append(KernelPath(name, "linear", _span(lo, hi), kernel, graphs, fallback))
    layers = _all_layers(model)
    multi = sorted({*runner.verify_buckets, *runner.chunk_buckets})
    paths += _embedding_paths(runner)
    paths += [
        KernelPath(
            layers,
            "rms_norm",
            "any",
            "triton rms_norm (residual add fused); in the GEMV where a linear says +norm",
            "all",
        ),
        *_rope_paths(layers, runner, rows),
        KernelPath(
            layers,
            "silu_mul",
            "any",
            "triton silu_mul; in the GEMV where a linear says +norm_glu",
            "all",
        ),
        _decode_attention_path(layers, runner),
    ]
    if multi:
        paths.append(
            KernelPath(
                layers,
                "attention.multi",
                _span(multi[0], multi[-1]),
                "triton split-K decode attention, multi-query",
                "; ".join(
                    _family(fam, sizes)
                    for fam, sizes in (
                        ("verify", runner.verify_buckets),
                        ("chunk", runner.chunk_buckets),
                    )
                    if sizes
                ),
            )
        )
    paths += [
        KernelPath(
            layers,
            "attention.prefill",
            _span(runner.buckets[0], runner.buckets[-1]),
            "torch sdpa (causal)",
            _family("prefill", runner.buckets),
        ),
        *_greedy_paths(runner),
        KernelPath(
            HEAD, "sampling.sample", "1", "torch top-k/top-p + triton philox race", "*-sample"
        ),
    ]
    return compact(paths)


EMBED = "tok_embeddings"


def _embedding_paths(runner: GraphRunner) -> list[KernelPath]:
    """The embedding lookup: the CUDA kernel in the decode graphs where it runs
    (engine/cuda/embed.py), PyTorch's everywhere else."""
    embed = getattr(runner, "embed", None)  # test stand-ins for a runner may lack it
    if embed is None:
        return [KernelPath(EMBED, "embedding", "any", "torch embedding", "all")]
    more = [r for r in engine_rows(runner) if r > 1]
    paths = [KernelPath(EMBED, "embedding", "1", str(embed.label), "decode")]
    if more:
        graphs = _families(runner, more[0], more[-1], head=False)
        paths.append(
            KernelPath(EMBED, "embedding", _span(more[0], more[-1]), "torch embedding", graphs)
        )
    return paths


PICK_FUSED = "fused into the lm_head's epilogue (cuda int4 mma16 + pick)"


def _greedy_paths(runner: GraphRunner) -> list[KernelPath]:
    """The greedy pick: in the decode graphs fused into the lm_head where it was
    (GraphRunner.pick_fused), else the greedy kernel (or PyTorch's sequence)."""
    kernel = _greedy_kernel(runner)
    if not getattr(runner, "pick_fused", False):  # test stand-ins may lack it
        return [KernelPath(HEAD, "sampling.greedy", "1", kernel, "*-greedy; verify")]
    return [
        KernelPath(HEAD, "sampling.greedy", "1", PICK_FUSED, "decode-greedy"),
        KernelPath(HEAD, "sampling.greedy", "1", kernel, "prefill/chunk-greedy; verify"),
    ]


def _greedy_kernel(runner: GraphRunner) -> str:
    """The greedy step's argmax + log-probability: one CUDA kernel, or PyTorch's sequence."""
    greedy = getattr(runner, "greedy", None)  # test stand-ins for a runner may lack it
    return "torch argmax" if greedy is None else str(greedy.label)


TRITON_ROPE = "triton rope_cache (RoPE + KV-cache write)"


def _rope_paths(layers: str, runner: GraphRunner, rows: tuple[int, ...]) -> list[KernelPath]:
    """RoPE + KV-cache write: inside the fused decode attention for one token when that
    kernel runs, the Triton kernel for every row count otherwise."""
    if getattr(runner, "fused_attention", None) is None:
        return [KernelPath(layers, "rope_cache", "any", TRITON_ROPE, "all")]
    paths = [
        KernelPath(
            layers, "rope_cache", "1", "in the cuda fused decode attention (attention.decode)",
            _families(runner, 1, 1, head=False),
        )
    ]  # fmt: skip
    more = [r for r in rows if r > 1]
    if more:
        graphs = _families(runner, more[0], more[-1], head=False)
        paths.append(
            KernelPath(layers, "rope_cache", _span(more[0], more[-1]), TRITON_ROPE, graphs)
        )
    return paths


def _decode_attention_path(layers: str, runner: GraphRunner) -> KernelPath:
    """The one-token attention: the fused CUDA kernel, or the Triton split-K kernel and
    why (a fallback where nib's CUDA kernels should run here but could not be built)."""
    graphs = _families(runner, 1, 1, head=False)
    fused = getattr(runner, "fused_attention", None)
    if fused is not None:
        return KernelPath(layers, "attention.decode", "1", fused.label(), graphs)
    why: str = getattr(runner, "fused_attention_why", "")
    kernel = "triton split-K decode attention"
    if not why:
        return KernelPath(layers, "attention.decode", "1", kernel, graphs)
    fallback = why.startswith("cuda kernels unavailable") and "switched off" not in why
    return KernelPath(
        layers, "attention.decode", "1", f"{kernel} (no cuda fused kernel: {why})", graphs, fallback
    )


def reference_paths(model: Transformer, *, fallback: bool) -> tuple[KernelPath, ...]:
    """The PyTorch reference path: the CPU engine's (fallback=False) or, on a GPU below the
    kernels' compute capability, the allowed fallback (fallback=True)."""
    paths = [
        KernelPath(name, "linear", "any", linear_kernel(m, 1)[0], "", fallback)
        for name, m in linears(model)
    ]
    layers = _all_layers(model)
    for op in ("rms_norm", "rope_cache", "silu_mul"):
        paths.append(KernelPath(layers, op, "any", "torch (reference)", "", fallback))
    paths.append(KernelPath(layers, "attention", "any", "torch sdpa", "", fallback))
    paths.append(KernelPath(HEAD, "sampling", "1", "torch argmax / multinomial", "", fallback))
    return compact(paths)


_LAYER = re.compile(r"^layers\.(\d+)(?:-(\d+))?(\..*)?$")


def compact(paths: Iterable[KernelPath]) -> tuple[KernelPath, ...]:
    """Merge entries of consecutive layers that agree in everything but the layer index."""
    out: list[KernelPath] = []
    open_at: dict[tuple[object, ...], int] = {}  # (suffix, rest of the entry) -> index in out
    for p in paths:
        m = _LAYER.match(p.layer)
        if m is None:
            out.append(p)
            continue
        lo, hi, suffix = int(m[1]), int(m[2] or m[1]), m[3] or ""
        key = (suffix, p.op, p.rows, p.kernel, p.graphs, p.fallback)
        i = open_at.get(key)
        if i is not None:
            prev = _LAYER.match(out[i].layer)
            assert prev is not None
            if int(prev[2] or prev[1]) + 1 == lo:
                out[i] = replace(out[i], layer=f"layers.{prev[1]}-{hi}{suffix}")
                continue
        open_at[key] = len(out)
        out.append(p if lo == hi else replace(p, layer=f"layers.{lo}-{hi}{suffix}"))
    return tuple(out)
