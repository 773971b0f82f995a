"""The feed-forward block at batch 1: one fused launch (engine/cuda/mlp16.cu) against the
two GEMV kernels the decode step runs now (norm + GLU, then the residual down product).

    python3 bench/micro_mlp16.py --out bench/results [--shapes qwen2.5-coder-1.5b]

For each shape (bf16, random weights, as many layers as the model has, so the weights
never sit in L2), the two-kernel pair takes the fastest config of each kernel as
start-up ranks them alone (kernels/gemv.py's candidates: the Triton tiles and
gemv16.cu's configs), then the best of the top-3 x top-3 pairs timed as a chain of
every layer's two launches; each mlp16 config is timed as a chain of every layer's
one launch. Timing: cuda/timing.py (a CUDA graph, programmatic dependent launch as in
the decode step, median of replays), µs per layer. Each mlp16 config is checked
against the float64 reference first.

Napkin math: a layer's floor = its gate/up + down weight bytes / the device-to-device
copy bandwidth measured at the start of the same run (1.5B: 82.6 MB -> ~19.5 us;
7B: 270.5 MB -> ~64 us).
Writes bench/results/<date>-micro-mlp16.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import copy_bandwidth_gbps, device_name

from nib.engine.cuda import mlp16
from nib.engine.cuda.timing import graph_us
from nib.engine.kernels import gemv as tg

SHAPES = {  # hidden K, intermediate F, layers
    "qwen2.5-coder-1.5b": (1536, 8960, 28),
    "llama-2-7b": (4096, 11008, 32),
}
DTYPE = torch.bfloat16
EPS = 1e-6


def layers(k: int, f: int, n: int) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator(device="cuda").manual_seed(0)
    return [
        {
            "wgu": (torch.randn(2 * f, k, generator=g, device="cuda") * k**-0.5).to(DTYPE),
            "wd": (torch.randn(k, f, generator=g, device="cuda") * f**-0.5).to(DTYPE),
            "nw": (1 + 0.1 * torch.randn(k, generator=g, device="cuda")).to(DTYPE),
        }
        for _ in range(n)
    ]


def bench_shape(name: str, bw: float) -> list[dict]:
    k, f, n = SHAPES[name]
    ws = layers(k, f, n)
    weight_bytes = (2 * f * k + k * f) * 2
    floor_us = weight_bytes / (bw * 1e3)
    h = (torch.randn(k, device="cuda")).to(DTYPE)
    act = torch.empty(f, device="cuda", dtype=DTYPE)
    rows: list[dict] = []

    def row(impl: str, cfg: str, us: float, **extra: object) -> None:
        rows.append({"shape": name, "impl": impl, "config": cfg, "us_per_layer": us,
                     "weight_bytes": weight_bytes, "floor_us": floor_us,
                     "fraction_of_floor": floor_us / us, **extra})  # fmt: skip
        print(f"  {name} {impl:10s} {cfg:34s} {us:8.2f} us  ({floor_us / us:.0%} of floor)")

    # The two kernels alone, each config over every layer (as start-up ranks them).
    def gate_up(cfg: tg.AnyGemvConfig, w: dict) -> object:
        bufs = tg.split_buffers(f, cfg, h.device)
        return partial(tg._launch, h, w["wgu"], None, act, f, cfg, w["nw"], EPS, tg.EPI_GLU, bufs)

    def down(cfg: tg.AnyGemvConfig, w: dict) -> object:
        bufs = tg.split_buffers(k, cfg, h.device)
        return partial(tg._launch, act, w["wd"], None, h, k, cfg, None, 0.0, tg.EPI_RESIDUAL, bufs)

    ranked = {}
    for part, make, weight in (("gate_up", gate_up, ws[0]["wgu"]), ("down", down, ws[0]["wd"])):
        fusion = "norm_glu" if part == "gate_up" else "residual"
        timed = []
        for cfg in tg._candidates(weight, fusion):
            try:
                us = graph_us([make(cfg, w) for w in ws], calls=2 * n)
            except Exception as exc:  # a config that fails here is reported and skipped
                print(f"  {part} {tg.config_label(cfg)}: {type(exc).__name__}: {exc}")
                continue
            timed.append((us, cfg))
        timed.sort(key=lambda e: e[0])
        ranked[part] = timed
        row(f"{part}-alone", tg.config_label(timed[0][1]), timed[0][0])
    best_pair: tuple[float, str] | None = None
    for _, cg in ranked["gate_up"][:3]:
        for _, cd in ranked["down"][:3]:
            calls = []
            for w in ws:
                calls += [gate_up(cg, w), down(cd, w)]
            us = graph_us(calls, calls=2 * n) * 2  # per layer = two calls
            label = f"{tg.config_label(cg)} + {tg.config_label(cd)}"
            if best_pair is None or us < best_pair[0]:
                best_pair = (us, label)
    assert best_pair is not None
    row("two-kernels", best_pair[1], best_pair[0])

    # The fused block, every config: checked first, then a chain of every layer.
    for cfg in mlp16.candidates(ws[0]["wgu"], ws[0]["wd"]):
        blocks = [mlp16.Mlp16(w["wgu"], w["wd"], cfg) for w in ws]
        h0 = torch.randn(k, device="cuda").to(DTYPE)
        hh = h0.clone()
        blocks[0].run(hh, ws[0]["nw"], EPS)
        ref = mlp16.reference(h0, ws[0]["nw"], EPS, ws[0]["wgu"], ws[0]["wd"])
        err = float((hh.double() - ref.double()).norm() / ref.double().norm())
        if not err <= 2e-3:
            row("mlp16", cfg.label(), float("nan"), error=f"WRONG: rel err {err:.2e}")
            continue
        calls = [partial(b.run, h, w["nw"], EPS) for b, w in zip(blocks, ws, strict=True)]
        us = graph_us(calls, calls=n)
        row("mlp16", cfg.label(), us, rel_err=err, blocks=blocks[0].blocks)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    args = ap.parse_args()
    bw = copy_bandwidth_gbps()
    print(f"{device_name()}, torch {torch.__version__}, copy bandwidth {bw:.0f} GB/s")
    rows = []
    for name in args.shapes.split(","):
        rows += bench_shape(name, bw)
    result = {
        "date": datetime.date.today().isoformat(),
        "device": device_name(),
        "torch": torch.__version__,
        "command": "python3 bench/micro_mlp16.py " + " ".join(sys.argv[1:]),
        "copy_bandwidth_gbps": bw,
        "rows": rows,
    }
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / f"{result['date']}-micro-mlp16.json"
        path.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
