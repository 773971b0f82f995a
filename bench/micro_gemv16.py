"""16-bit batch-1 GEMV: nib's CUDA kernel (engine/cuda/gemv16.cu) vs the Triton kernel vs cuBLAS.

    python3 bench/micro_gemv16.py --out bench/results [--quick] [--budget-s 420]

Shapes: the linears of Llama-2-7B and Qwen2.5-Coder-1.5B, bf16, one row. Each layer
is timed plain (y = W x, + the qkv bias for Qwen) and with the fusion the decoder
runs it with (qkv, lm_head: RMSNorm before; o_proj, down: residual add after;
gate_up: RMSNorm and SiLU(gate) * up, N/2 outputs); cuBLAS runs the plain product.
For each kernel every config start-up would try (kernels/gemv.py CANDIDATES,
gemv16.candidates) is checked against a float64 reference, then timed, and the
best kept. Timing: CALLS calls per CUDA graph replay, weights rotated through
enough copies that none stays in L2 (60 MiB), median of replays.

Napkin math: a layer's floor is its weight bytes / the device-to-device copy
bandwidth measured at the start of the same run (e.g. 7B gate_up: 180 MB / 4.28
TB/s = 42.1 us); a decode step's GEMVs = layers x (qkv + o + gate_up + down) +
lm_head, 7B: 13.0 GB -> 3.05 ms, 1.5B: 3.1 GB -> 0.73 ms.
Writes bench/results/<date>-micro-gemv16.json. A config that fails is reported
and skipped; the run goes on.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
import time
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import copy_bandwidth_gbps, device_name

from nib.engine.cuda import gemv16
from nib.engine.cuda.timing import graph_us
from nib.engine.kernels import gemv as tg

# (layer, out N, in K, fusion, bias); gate_up's N holds gate and up (N/2 outputs).
LAYERS = {
    "llama-2-7b": [("qkv", 12288, 4096, "norm", False), ("o_proj", 4096, 4096, "residual", False),
                   ("gate_up", 22016, 4096, "norm_glu", False),
                   ("down", 4096, 11008, "residual", False),
                   ("lm_head", 32000, 4096, "norm", False)],
    "qwen2.5-coder-1.5b": [("qkv", 2048, 1536, "norm", True),
                           ("o_proj", 1536, 1536, "residual", False),
                           ("gate_up", 17920, 1536, "norm_glu", False),
                           ("down", 1536, 8960, "residual", False),
                           ("lm_head", 151936, 1536, "norm", False)],
}  # fmt: skip
NUM_LAYERS = {"llama-2-7b": 32, "qwen2.5-coder-1.5b": 28}
ROTATE_BYTES = 512 << 20  # >> 60 MiB of L2
CALLS = 40  # per graph replay
TOL = 2e-3  # relative error against the float64 reference (bf16 outputs)
DTYPE = torch.bfloat16


def copies(nbytes: int) -> int:
    return max(2, math.ceil(ROTATE_BYTES / max(nbytes, 1)))


class Layer:
    """One shape's rotated weights, inputs and float64 references per mode."""

    def __init__(self, n: int, k: int, bias: bool) -> None:
        g = torch.Generator(device="cuda").manual_seed(n + k)

        def randn(*shape: int, scale: float = 1.0) -> torch.Tensor:
            return (torch.randn(*shape, generator=g, device="cuda") * scale).to(DTYPE)

        self.n, self.k = n, k
        self.weight_bytes = n * k * 2
        self.ws = [randn(n, k, scale=k**-0.5) for _ in range(copies(self.weight_bytes))]
        self.b = randn(n) if bias else None
        self.x = randn(1, 1, k, scale=3.0)
        self.nw = (1 + 0.1 * torch.randn(k, generator=g, device="cuda")).to(DTYPE)
        self.res = randn(n)
        self.scratch = self.res.clone()
        self._refs: dict[str, torch.Tensor] = {}

    def reference(self, mode: str) -> torch.Tensor:
        """float64, as the kernels round (computed once per mode: a 1.5B lm_head in float64
        is 1.9 GB)."""
        if mode not in self._refs:
            w, x = self.ws[0], self.x
            if mode == "residual":
                ref = gemv16.reference(x, w, self.b, residual=self.res)
            elif mode == "norm":
                ref = gemv16.reference(x, w, self.b, self.nw, 1e-6)
            elif mode == "norm_glu":
                ref = gemv16.reference(x, w, None, self.nw, 1e-6, glu=True)
            else:
                ref = gemv16.reference(x, w, self.b)
            self._refs[mode] = ref.double()
        return self._refs[mode]

    def call(self, mode: str, cfg: tg.AnyGemvConfig, w: torch.Tensor, buffers: object) -> object:
        """One call of kernels/gemv.py's entry point for mode (dispatches on cfg's type)."""
        if mode == "residual":
            return tg.gemv_residual(self.x, w, self.b, self.scratch, cfg, buffers)  # type: ignore[arg-type]
        if mode in ("norm", "norm_glu"):
            glu = mode == "norm_glu"
            b = None if glu else self.b
            return tg.norm_gemv(self.x, self.nw, 1e-6, w, b, cfg, glu, buffers)  # type: ignore[arg-type]
        return tg.gemv(self.x, w, self.b, cfg, buffers)  # type: ignore[arg-type]

    def run_once(self, mode: str, cfg: tg.AnyGemvConfig) -> float:
        """Relative error of one call on the first copy against the reference."""
        n_out = self.n // 2 if mode == "norm_glu" else self.n
        buffers = tg.split_buffers(n_out, cfg, torch.device("cuda"))
        if mode == "residual":
            self.scratch.copy_(self.res)
        out = self.call(mode, cfg, self.ws[0], buffers)
        got = self.scratch if mode == "residual" else out
        assert isinstance(got, torch.Tensor)
        ref = self.reference(mode).double()
        return float((got.double().reshape(-1) - ref).norm() / ref.norm())


def best_of(
    layer: Layer, mode: str, configs: list, deadline: float, tried: list[str]
) -> tuple[float, str] | None:
    best: tuple[float, str] | None = None
    n_out = layer.n // 2 if mode == "norm_glu" else layer.n
    for cfg in configs:
        label = tg.config_label(cfg)
        if best is not None and time.monotonic() > deadline:
            tried.append(f"{label}: skipped (time budget)")
            continue
        try:
            err = layer.run_once(mode, cfg)
            if not err <= TOL:
                tried.append(f"{label}: WRONG (rel err {err:.1e})")
                continue
            buffers = tg.split_buffers(n_out, cfg, torch.device("cuda"))
            us = graph_us(
                [partial(layer.call, mode, cfg, w, buffers) for w in layer.ws], calls=CALLS
            )
        except Exception as exc:  # a config that does not compile or launch here
            tried.append(f"{label}: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
            continue
        tried.append(f"{label}: {us:.2f} us")
        if best is None or us < best[0]:
            best = (us, label)
    return best


def bench_layer(
    n: int, k: int, fusion: str, bias: bool, deadline: float, quick: bool, cuda_ok: bool
) -> list[dict]:
    layer = Layer(n, k, bias)
    rows: list[dict] = []
    try:
        err = float(
            (
                F.linear(layer.x, layer.ws[0], layer.b).double().reshape(-1)
                - layer.reference("plain")
            )
            .norm()
            .div(layer.reference("plain").norm())
        )
        us = graph_us([partial(F.linear, layer.x, w, layer.b) for w in layer.ws], calls=CALLS)
        rows.append({"impl": "cublas", "mode": "plain", "us_median": us, "rel_err": err})
    except Exception as exc:
        print(f"  cublas failed: {exc}", file=sys.stderr)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for mode in ("plain", fusion):
        glu = mode == "norm_glu"
        triton_cfgs = list(tg.CANDIDATES[:4] if quick else tg.CANDIDATES)
        cuda_cfgs: list = []
        if cuda_ok:
            cuda_cfgs = gemv16.candidates(n // 2 if glu else n, k, glu, sms)
        for impl, configs in (("triton", triton_cfgs), ("cuda", cuda_cfgs)):
            if not configs:
                continue
            tried: list[str] = []
            best = best_of(layer, mode, configs, deadline, tried)
            if best is None:
                print(f"  {impl} {mode}: no config ran: {tried}", file=sys.stderr)
                continue
            rows.append({"impl": impl, "mode": mode, "us_median": best[0], "config": best[1],
                         "tried": tried})  # fmt: skip
    for r in rows:
        r["weight_bytes"] = layer.weight_bytes
    return rows


def step_totals(result: dict) -> list[dict]:
    """Per model: a decode step's GEMV time on each kernel (its fused mode where it has
    one), and on the best per layer (what start-up's timing would keep), vs the floor."""
    us = {(r["model"], r["layer"], r["impl"], r["mode"]): r["us_median"] for r in result["rows"]}
    out = []
    for model, layers in LAYERS.items():
        count = NUM_LAYERS[model]
        floor = sum(n * k * 2 * (count if name != "lm_head" else 1) for name, n, k, _, _ in layers)
        floor_ms = floor / result["copy_bandwidth_gbps"] / 1e6
        totals: dict[str, float] = {}
        for impl in ("cublas", "triton", "cuda", "best"):
            total = 0.0
            for name, _, _, fusion, _ in layers:
                if impl == "best":
                    cands = [us.get((model, name, i, fusion), math.inf) for i in ("triton", "cuda")]
                    t = min(cands)
                else:
                    mode = "plain" if impl == "cublas" else fusion
                    t = us.get((model, name, impl, mode), math.nan)
                total += t * (count if name != "lm_head" else 1)
            totals[impl] = total / 1e3
        out.append({"model": model, "floor_ms": floor_ms, "ms": totals})
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    p.add_argument(
        "--quick",
        action="store_true",
        help="only the first 4 Triton tiles (each compiles; every CUDA config still runs)",
    )
    p.add_argument("--budget-s", type=float, default=420.0, help="time for trying configs")
    p.add_argument("--models", default=",".join(LAYERS), help="comma-separated subset")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("bench/micro_gemv16.py needs a CUDA GPU", file=sys.stderr)
        return 2
    started = time.monotonic()
    bw = copy_bandwidth_gbps()
    print(f"{device_name()}: copy bandwidth {bw:.0f} GB/s", flush=True)
    from nib.engine.cuda.loader import unavailable_reason

    why = unavailable_reason(torch.device("cuda"))
    if why:
        print(f"nib's CUDA kernels unavailable ({why}): timing Triton and cuBLAS only")
    shapes = [(m, *spec) for m in args.models.split(",") for spec in LAYERS[m]]
    rows = []
    for i, (model, name, n, k, fusion, bias) in enumerate(shapes):
        deadline = started + args.budget_s * (i + 1) / len(shapes)
        try:
            got = bench_layer(n, k, fusion, bias, deadline, args.quick, not why)
        except Exception as exc:  # e.g. out of memory: report and go on
            print(f"  {model}.{name} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            continue
        for r in got:
            r.update(model=model, layer=name, n=n, k=k)
            r["gbps"] = r["weight_bytes"] / r["us_median"] / 1e3
            r["fraction_of_copy_bw"] = r["gbps"] / bw
            rows.append(r)
            print(f"  {model:<19} {name:<8} {r['impl']:<7} {r['mode']:<9} {r['us_median']:8.2f} us "
                  f"{r['gbps']:6.0f} GB/s {r['fraction_of_copy_bw']:5.2f} {r.get('config', '')}",
                  flush=True)  # fmt: skip
        torch.cuda.empty_cache()
    date = datetime.date.today().isoformat()
    result = {
        "date": date,
        "device": device_name(),
        "torch": torch.__version__,
        "command": "python3 " + " ".join(["bench/micro_gemv16.py", *sys.argv[1:]]),
        "copy_bandwidth_gbps": bw,
        "cuda_kernels": why or "available",
        "rows": rows,
    }
    result["steps"] = step_totals(result)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{date}-micro-gemv16.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"\nwrote {path} ({time.monotonic() - started:.0f} s)\n")
    print(f"{'decode-step GEMVs (ms)':<22} {'cublas':>8} {'triton':>8} {'cuda':>8} {'best':>8} "
          f"{'floor':>7}")  # fmt: skip
    for s in result["steps"]:
        ms = s["ms"]
        print(f"{s['model']:<22} {ms['cublas']:8.3f} {ms['triton']:8.3f} {ms['cuda']:8.3f} "
              f"{ms['best']:8.3f} {s['floor_ms']:7.3f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
