"""One decode step's attention on the GPU: nib's fused CUDA kernel (RoPE + KV-cache write +
split-K attention, engine/cuda/attention.cu) vs the Triton pair it replaces (rope_cache,
then the split-K decode attention), in one run.

    python3 bench/micro_attention.py [--out bench/results] [--dtype bf16|fp16]

Shapes: the heads of Llama-2-7B (32 / 32, head_dim 128) and Qwen2.5-Coder-1.5B (12 / 2,
GQA 6) at filled lengths L = 64, 640, 4096 of a 4096-position cache. Every timing is of
calls back to back inside one CUDA graph, each call on its own layer's cache (at least
32 layers, more until the K/V read per replay is 4x the 60 MiB L2, so they come from
HBM as in a real step), median over replays, in microseconds per layer. The fused
kernel runs its default launch shape (with its splits merged in a thread-block cluster
on sm_90, and again through global memory), and a sweep of (splits, warps) with either
merge.

Napkin math: bytes per layer = K + V of L positions (2 L KVH D 2) + the qkv row, cos and
sin; floor = bytes / the device-to-device copy bandwidth measured at the start of the
run. Llama-2-7B at L = 640: 10.5 MB, 2.5 us; at 4096: 67 MB, 16 us. Qwen2.5-1.5B at
640: 0.65 MB (latency, not bandwidth: ~1-2 us of launch, position read, HBM latency
and merge). A variant that fails is reported and skipped. Writes
<out>/<date>-micro-attention.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
import time
import traceback
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch

from nib.engine.cuda.timing import graph_us

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import copy_bandwidth_gbps, device_name

MODELS = {"llama-2-7b": (32, 32, 128), "qwen2.5-coder-1.5b": (12, 2, 128)}
LENGTHS = (64, 640, 4096)
CONTEXT = 4096
MIN_LAYERS = 32
L2_BYTES = 60 << 20
MAX_LAYERS = 2048
REPLAYS = 25
SWEEP = {
    "llama-2-7b": [(s, w) for s in (2, 4, 8, 16) for w in (4, 8)],
    "qwen2.5-coder-1.5b": [(s, w) for s in (2, 4, 8, 16, 32) for w in (4, 8)],
}
BUDGET_S = float(os.environ.get("MICRO_ATTENTION_BUDGET_S", "90"))  # stop sweeping extras past this
PAIR = "triton rope + attention"


def layers_for(kv_bytes: int) -> int:
    """Layer copies per graph: enough that one replay reads 4x the L2 from HBM."""
    return max(MIN_LAYERS, min(MAX_LAYERS, math.ceil(4 * L2_BYTES / max(kv_bytes, 1))))


class Layers:
    """`n` layers' caches and qkv rows of one model shape, and the shared RoPE tables."""

    def __init__(self, heads: int, kv_heads: int, d: int, n: int, dtype: torch.dtype) -> None:
        g = torch.Generator(device="cuda").manual_seed(0)
        self.heads, self.kv_heads, self.d, self.dtype = heads, kv_heads, d, dtype
        shape = (1, kv_heads, CONTEXT, d)
        self.k = [torch.randn(shape, device="cuda", generator=g).to(dtype) for _ in range(n)]
        self.v = [torch.randn(shape, device="cuda", generator=g).to(dtype) for _ in range(n)]
        width = (heads + 2 * kv_heads) * d
        self.qkv = [
            torch.randn(1, 1, width, device="cuda", generator=g).to(dtype) for _ in range(n)
        ]
        inv = 1.0 / (10000 ** (torch.arange(0, d, 2, device="cuda").float() / d))
        freqs = torch.outer(torch.arange(CONTEXT, device="cuda").float(), inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos, self.sin = emb.cos().to(dtype), emb.sin().to(dtype)


class Recorder:
    """Rows of one (model, L) point: printed as they come, kept for the JSON."""

    def __init__(self, model: str, dtype: torch.dtype, length: int, n: int, nbytes: int,
                 copy_gbps: float) -> None:  # fmt: skip
        self.nbytes = nbytes
        self.base: dict[str, object] = {
            "model": model, "dtype": str(dtype).split(".")[-1], "L": length, "layers": n,
            "bytes": nbytes, "floor_us": round(nbytes / (copy_gbps * 1e3), 3),
        }  # fmt: skip
        self.rows: list[dict[str, object]] = []

    def add(self, kernel: str, variant: str, us: float | None, error: str = "") -> None:
        rec = {**self.base, "kernel": kernel, "variant": variant}
        if us is not None:
            rec |= {"us": round(us, 3), "gbps": round(self.nbytes / us / 1e3, 1)}
        if error:
            rec["error"] = error
        self.rows.append(rec)
        shown = f"{us:8.2f}" if us is not None else "  failed"
        print(
            f"{rec['model']:20s} L={rec['L']:5d} {kernel:24s} {variant:16s} {shown} us/layer"
            f"  (floor {rec['floor_us']:.2f}){'  ' + error if error else ''}",
            flush=True,
        )


def triton_calls(
    layers: Layers, pos: torch.Tensor, n: int
) -> dict[str, list[Callable[[], torch.Tensor]]]:
    """The Triton rows: rope_cache alone, the split-K attention alone, both (the path the
    fused kernel replaces), one call per layer."""
    from nib.engine.kernels.decode_attention import DecodeAttention
    from nib.engine.kernels.rope_cache import rope_cache

    h, kvh = layers.heads, layers.kv_heads
    attention = DecodeAttention(h, kvh, layers.d, CONTEXT, torch.device("cuda"))

    def rope(i: int) -> torch.Tensor:
        return rope_cache(
            layers.qkv[i], pos, layers.cos, layers.sin, layers.k[i], layers.v[i], h, kvh
        )

    def attend(i: int, q: torch.Tensor) -> torch.Tensor:
        return attention(q, layers.k[i], layers.v[i], pos)

    def pair(i: int) -> torch.Tensor:
        return attend(i, rope(i))

    q0 = rope(0)
    return {
        "triton rope_cache": [partial(rope, i) for i in range(n)],
        "triton decode attention": [partial(attend, i, q0) for i in range(n)],
        PAIR: [partial(pair, i) for i in range(n)],
    }


def fused_variants(model: str) -> list[tuple[str, dict[str, int | bool]]]:
    """The default launch shape, and the same with the splits merged through global
    memory (a last-arriving block) instead of a thread-block cluster; then the (splits,
    warps) sweep with the global merge, and with the cluster merge where it applies
    (2..8 splits, sm_90)."""
    from nib.engine.cuda.attention import cluster_default

    out: list[tuple[str, dict[str, int | bool]]] = [
        ("default", {}),
        ("default, global merge", {"cluster": False}),
    ]
    for s, w in SWEEP[model]:
        out.append((f"s{s}w{w}", {"splits": s, "warps": w, "cluster": False}))
        if cluster_default(s, torch.device("cuda")):  # 2..MAX_CLUSTER splits, sm_90
            out.append((f"s{s}w{w}c", {"splits": s, "warps": w, "cluster": True}))
    return out


def bench_length(
    model: str, layers: Layers, length: int, copy_gbps: float, deadline: float
) -> list[dict[str, object]]:
    from nib.engine.cuda.attention import FusedDecodeAttention

    h, kvh, d, dtype = layers.heads, layers.kv_heads, layers.d, layers.dtype
    kv_bytes = 2 * length * kvh * d * 2
    n = layers_for(kv_bytes)
    pos = torch.tensor([length - 1], device="cuda")
    extra = (h + 2 * kvh) * d * 2 + 2 * d * 2 + h * d * 2  # the qkv row, cos + sin rows, out
    rec = Recorder(model, dtype, length, n, kv_bytes + extra, copy_gbps)
    triton = triton_calls(layers, pos, n)
    for kernel, calls in triton.items():
        try:
            rec.add(kernel, "", graph_us(calls, reps=REPLAYS))
        except Exception as exc:
            rec.add(kernel, "", None, f"{type(exc).__name__}: {exc}")
    want = triton[PAIR][0]().float()  # layer 0's output, to check each variant against
    for name, kw in fused_variants(model):
        if name != "default" and time.monotonic() > deadline:
            rec.add("cuda fused", name, None, "skipped: time budget")
            continue
        try:
            fused = FusedDecodeAttention(h, kvh, d, CONTEXT, dtype, torch.device("cuda"), **kw)
            calls = [
                partial(fused, layers.qkv[i], pos, layers.cos, layers.sin, layers.k[i], layers.v[i])
                for i in range(n)
            ]
            err = float((calls[0]().float() - want).norm() / want.norm())
            us = graph_us(calls, reps=REPLAYS)
            label = f"default {fused.shape.label()}" if name == "default" else name
            rec.add("cuda fused", label, us, "" if err < 3e-2 else f"disagrees: {err:.2e}")
            rec.rows[-1]["rel_err_vs_triton"] = round(err, 6)
        except Exception as exc:
            traceback.print_exc()
            rec.add("cuda fused", name, None, f"{type(exc).__name__}: {exc}")
    return rec.rows


def bench_shape(
    model: str, dtype: torch.dtype, copy_gbps: float, deadline: float
) -> list[dict[str, object]]:
    h, kvh, d = MODELS[model]
    n_max = max(layers_for(2 * length * kvh * d * 2) for length in LENGTHS)
    layers = Layers(h, kvh, d, n_max, dtype)
    rows: list[dict[str, object]] = []
    for length in LENGTHS:
        rows += bench_length(model, layers, length, copy_gbps, deadline)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        sys.exit(2)
    from nib.engine.cuda import loader

    why = loader.unavailable_reason(torch.device("cuda"))
    if why:
        print(f"nib's CUDA kernels unavailable ({why}): only the Triton rows will run")
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    copy_gbps = copy_bandwidth_gbps()
    print(f"{device_name()}: copy bandwidth {copy_gbps:.0f} GB/s")
    deadline = time.monotonic() + BUDGET_S
    rows: list[dict[str, object]] = []
    for model in MODELS:
        try:
            rows += bench_shape(model, dtype, copy_gbps, deadline)
        except Exception as exc:  # e.g. out of memory: report, go on with the next shape
            traceback.print_exc()
            rows.append({"model": model, "error": f"{type(exc).__name__}: {exc}"})
        torch.cuda.empty_cache()
    print("\nbest per shape and length (us per layer):")
    for model in MODELS:
        for length in LENGTHS:
            mine = [r for r in rows if r.get("model") == model and r.get("L") == length]
            timed = [r for r in mine if "us" in r and not r.get("error")]
            pair = next((r for r in timed if r["kernel"] == PAIR), None)
            fused = [r for r in timed if r["kernel"] == "cuda fused"]
            if not fused:
                continue
            best = min(fused, key=lambda r: float(r["us"]))  # type: ignore[arg-type]
            base = f"{pair['us']:.2f}" if pair else "n/a"
            print(
                f"  {model:20s} L={length:5d}: triton pair {base:>7s}, fused {best['us']:.2f}"
                f" ({best['variant']}), floor {best['floor_us']:.2f}"
            )
    today = datetime.date.today().isoformat()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{today}-micro-attention.json"
    record = {
        "date": today,
        "device": device_name(),
        "torch": torch.__version__,
        "command": " ".join(sys.argv),
        "copy_gbps": round(copy_gbps, 1),
        "context": CONTEXT,
        "rows": rows,
    }
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
