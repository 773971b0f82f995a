"""One decoder layer's INT4 products at one row: a launch per product against one chain.

    python3 bench/int4_chain.py [--out bench/results]      # GPU host, ~1 minute

At batch 1 a layer is four small products in a row (o_proj + residual, gate_up with
the RMSNorm and SiLU·mul, down + residual, the next layer's qkv with its RMSNorm), and
each launch of its own pays a fixed cost that its bytes do not (issue 5's misses:
about 2.9 µs per launch on the H200, bench/README.md). engine/cuda/w4a16.cu's chains
run the four in one launch, op i's blocks waiting on a counter of op i - 1's finished
blocks after they have loaded their own weights. For the Llama-2-7B and
Qwen2.5-Coder-1.5B shapes, with the data dependencies of the real layer (each product
reads what the one before wrote), in a CUDA graph over enough layer copies that no
weight sits in L2:

- `separate`: the four kernels launched one after another (PDL, as the decode graph
  runs them), each with the fastest config a chain can also run (per warp count);
- `chain`: the same four ops, the same configs, one launch per layer;
- `separate-any`: each product with its fastest config of all (bulk copies included),
  what the decode step runs today.

Checks first that a chain's outputs equal the separate launches' bit for bit. Writes
bench/results/<date>-int4-chain.json (µs per layer, weight bytes, floor at the copy
bandwidth measured in the same run) and prints a table.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import copy_bandwidth_gbps

SHAPES = {
    # hidden, q_size + 2 kv_size, intermediate
    "llama-2-7b": (4096, 12288, 11008),
    "qwen2.5-coder-1.5b": (1536, 2048, 8960),
}
ROTATE_BYTES = 512 << 20  # >> the 60 MiB L2
EPS = 1e-6


class Layer:
    """One layer's four INT4 products (random codes) and the tensors they chain through."""

    def __init__(self, hidden: int, qkv: int, inter: int, seed: int) -> None:
        from nib.engine.cuda.w4a16 import CudaInt4

        g = torch.Generator(device="cuda").manual_seed(seed)

        def weight(n: int, k: int, fusion: str, name: str) -> CudaInt4:
            codes = torch.randint(0, 16, (n, k), generator=g, device="cuda", dtype=torch.uint8)
            scales = (torch.rand(k // 128, n, generator=g, device="cuda") * 0.02 + 0.001).half()
            return CudaInt4(codes, scales, None, fusion, name, torch.float16)

        self.o = weight(hidden, hidden, "residual", "o_proj")
        self.gate_up = weight(2 * inter, hidden, "norm_glu", "gate_up")
        self.down = weight(hidden, inter, "residual", "down")
        self.qkv = weight(qkv, hidden, "norm", "qkv")
        self.attn = torch.randn(hidden, device="cuda", generator=g).half()
        self.h = torch.randn(hidden, device="cuda", generator=g).half()
        self.nw = (1 + 0.1 * torch.randn(hidden, device="cuda", generator=g)).half()
        self.glu = torch.empty(inter, device="cuda", dtype=torch.float16)
        self.out = torch.empty(qkv, device="cuda", dtype=torch.float16)

    @property
    def weight_bytes(self) -> int:
        return sum(p.weight_bytes for p in (self.o, self.gate_up, self.down, self.qkv))

    def launches(self, cfgs: dict[str, object]) -> list:
        from nib.engine.cuda.w4a16 import EPI_GLU, EPI_PLAIN, EPI_RESIDUAL

        return [
            self.o.op(self.attn, self.h, 1, cfgs["o"], EPI_RESIDUAL),
            self.gate_up.op(self.h, self.glu, 1, cfgs["gate_up"], EPI_GLU, self.nw, EPS),
            self.down.op(self.glu, self.h, 1, cfgs["down"], EPI_RESIDUAL),
            self.qkv.op(self.h, self.out, 1, cfgs["qkv"], EPI_PLAIN, self.nw, EPS),
        ]


def launch_each(launches: list) -> Callable[[], None]:
    def run() -> None:
        for launch in launches:
            layer = launch.layer
            kernel = layer._module.kernel(launch.kernel)
            kernel.launch(
                launch.grid, (launch.cfg.warps * 32,), launch.args, launch.shared, pdl=layer.pdl
            )

    return run


def best_config(layers: list[Layer], op: str, candidates: list) -> tuple[object, float]:
    """The fastest of `candidates` for one product, timed alone over the layer copies."""
    from nib.engine.cuda.timing import graph_us

    best = None
    seen = set()
    for cfg in candidates:
        eff = getattr(layers[0], op).effective(cfg, 1)
        if eff in seen:
            continue
        seen.add(eff)
        for layer in layers:
            getattr(layer, op).prepare(eff, 1)
        fns = [launch_each([layer.launches({**dict.fromkeys(OPS, eff)})[OPS.index(op)]])
               for layer in layers]  # fmt: skip
        us = graph_us(fns, calls=4 * len(layers))
        if best is None or us < best[1]:
            best = (eff, us)
    assert best is not None
    return best


OPS = ("o", "gate_up", "down", "qkv")


def measure(shape: str, bw: float) -> list[dict]:
    from nib.engine.cuda.timing import graph_us
    from nib.engine.cuda.w4a16 import ONE_ROW, Int4Chain, chain_runs, runs_on

    hidden, qkv, inter = SHAPES[shape]
    first = Layer(hidden, qkv, inter, 0)
    n = max(2, math.ceil(ROTATE_BYTES / first.weight_bytes))
    layers = [first] + [Layer(hidden, qkv, inter, i) for i in range(1, n)]
    floor_us = first.weight_bytes / bw / 1e3
    cap = first.o.capability
    rows = []
    plans: list[tuple[str, int, dict]] = []
    for warps in (4, 8):
        cands = [c for c in ONE_ROW if c.warps == warps and chain_runs(c)]
        cfgs = {op: best_config(layers, op, cands)[0] for op in OPS}
        plans.append(("chain", warps, cfgs))
    any_cfgs = {
        op: best_config(layers, op, [c for c in ONE_ROW if runs_on(c, cap)])[0] for op in OPS
    }
    # The chain's outputs against the separate launches', bit for bit (fresh inputs).
    for _, _, cfgs in plans:
        layer = layers[0]
        # Fresh inputs: the timings above added to h in place until it overflowed.
        layer.attn.copy_(torch.randn(hidden, device="cuda"))
        layer.h.copy_(torch.randn(hidden, device="cuda"))
        h0 = layer.h.clone()
        launch_each(layer.launches(cfgs))()
        expected = (layer.h.clone(), layer.glu.clone(), layer.out.clone())
        if not all(torch.isfinite(t).all() for t in expected):
            raise SystemExit(f"{shape}: the separate launches left inf/NaN: no check possible")
        layer.h.copy_(h0)
        for t in (layer.glu, layer.out):
            t.fill_(float("nan"))
        Int4Chain(layer.launches(cfgs)).launch()
        torch.cuda.synchronize()
        for name, got, want in zip(
            ("h", "glu", "qkv"), (layer.h, layer.glu, layer.out), expected, strict=True
        ):
            if not torch.equal(got, want):
                raise SystemExit(f"{shape}: the chain's {name} differs from the separate launches")
        layer.h.copy_(h0)
    for _, warps, cfgs in plans:
        labels = {op: cfg.label() for op, cfg in cfgs.items()}
        sep = graph_us([launch_each(layer.launches(cfgs)) for layer in layers], calls=2 * n)
        chains = [Int4Chain(layer.launches(cfgs)) for layer in layers]
        chained = graph_us([c.launch for c in chains], calls=2 * n)
        for impl, us in (("separate", sep), ("chain", chained)):
            rows.append({"shape": shape, "impl": impl, "warps": warps, "configs": labels,
                         "us_per_layer": us, "weight_bytes": first.weight_bytes,
                         "floor_us": floor_us})  # fmt: skip
    any_us = graph_us([launch_each(layer.launches(any_cfgs)) for layer in layers], calls=2 * n)
    rows.append({"shape": shape, "impl": "separate-any", "warps": None,
                 "configs": {op: c.label() for op, c in any_cfgs.items()},
                 "us_per_layer": any_us, "weight_bytes": first.weight_bytes,
                 "floor_us": floor_us})  # fmt: skip
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    p.add_argument("--shapes", default=",".join(SHAPES))
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("bench/int4_chain.py needs a CUDA GPU", file=sys.stderr)
        return 2
    from nib.engine.cuda import loader

    why = loader.unavailable_reason(torch.device("cuda"))
    if why:
        print(f"nib CUDA kernels unavailable: {why}", file=sys.stderr)
        return 2
    started = time.monotonic()
    bw = copy_bandwidth_gbps()
    rows = []
    for shape in args.shapes.split(","):
        rows += measure(shape, bw)
    date = datetime.date.today().isoformat()
    result = {
        "date": date,
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "command": "python3 " + " ".join(["bench/int4_chain.py", *sys.argv[1:]]),
        "copy_bandwidth_gbps": bw,
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{date}-int4-chain.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {path} ({time.monotonic() - started:.0f} s), copy bandwidth {bw:.0f} GB/s")
    print(f"{'shape':<20} {'impl':<13} {'warps':>5} {'us/layer':>9} {'floor':>7} {'% floor':>8}")
    for r in rows:
        print(f"{r['shape']:<20} {r['impl']:<13} {r['warps'] or '':>5} {r['us_per_layer']:9.2f} "
              f"{r['floor_us']:7.2f} {100 * r['floor_us'] / r['us_per_layer']:7.0f}%")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
