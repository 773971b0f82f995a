"""What holds nib's INT4 kernel back at 2..16 rows: the activations' reads, or the rest?

    python3 bench/micro_w4_rows.py --out bench/results [--shapes llama-2-7b] [--ms 8,16]
        [--sources distinct]

Issue 5 asks for one Llama-2-7B layer's four linears in 40 µs at M = 16; they take
~49 µs there against ~36 at M = 1 (bench/int4_linear.py). At 2..16 rows each block of
`w4a16.cu` reads its K slice of every activation row from global memory, per warp and
group, just before the group's products (the one-row kernels stage the row in shared
memory once). Summed over the blocks that is ~170 MB of L2 reads a 7B layer at M = 16,
beside ~100 MB of weights. This script times every multi-row config of each layer (as
`bench/int4_linear.py` does: back to back in a CUDA graph, weights rotated out of L2) on
two activation tensors of the same M rows: `distinct` (an [M, K] tensor, what the engine
passes) and `one-row` (one row expanded to M, stride 0: every block reads the same K x 2
bytes, which stay in its SM's L1, so the L2 traffic and its latency all but vanish while
the loads and the products stay the same). If `one-row` is much faster, the activations'
reads are what to fix; if not, they are not. Every output is checked against an fp32
reference from a poisoned output (int4_linear.check_and_time). `--ms 1` times the
one-row configs the same way (activations staged in shared memory: both sources read
one row), which compares a kernel change at M = 1 and M = 16 in one run.
Writes `<out>/<date>-micro-w4-rows.json`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import copy_bandwidth_gbps, write_result
from int4_linear import LAYERS, check_and_time, copies, cuda_configs, random_int4

from nib.engine.quant.format import dequantize

SOURCES = ("distinct", "one-row")


def time_layer(k: int, n: int, m: int, only: tuple[str, ...] = SOURCES) -> list[dict]:
    from nib.engine.cuda.w4a16 import MULTI_ROW, ONE_ROW, CudaInt4

    g = torch.Generator(device="cuda").manual_seed(k * 7 + n + m)
    codes, scales = random_int4(n, k, g)
    w = dequantize(codes, scales)
    sources = {
        "distinct": torch.randn(m, k, device="cuda", generator=g).half(),
        "one-row": torch.randn(1, k, device="cuda", generator=g).half().expand(m, k),
    }
    sources = {name: x for name, x in sources.items() if name in only}
    base = CudaInt4(codes, scales, None, "", "bench", torch.float16)
    layers = [base] + [base.clone() for _ in range(copies(base.weight_bytes) - 1)]
    out = torch.empty(m, n, device="cuda", dtype=torch.float16)
    rows = []
    for eff in cuda_configs(base, ONE_ROW if m == 1 else MULTI_ROW, m):
        row = {"config": eff.label(), "m": m}
        for name, x in sources.items():
            err, us = check_and_time(base, layers, x, out, m, eff, x.float() @ w.t())
            if us is None:
                raise SystemExit(f"{eff.label()} m={m} {name}: rel err {err:.2e}")
            row[f"{name}_us"] = us
            row[f"{name}_rel_err"] = err
        rows.append(row)
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    p.add_argument("--shapes", default="llama-2-7b,qwen2.5-coder-1.5b")
    p.add_argument("--ms", default="16")
    p.add_argument("--layers", default="qkv,o_proj,gate_up,down")
    p.add_argument("--sources", default=",".join(SOURCES), help="activation sources to time")
    args = p.parse_args()
    only = tuple(args.sources.split(","))
    if any(s not in SOURCES for s in only):
        p.error(f"--sources: a comma-separated subset of {','.join(SOURCES)}")
    from nib.engine.cuda.w4a16 import MAX_ROWS

    try:
        ms = [int(v) for v in args.ms.split(",")]
    except ValueError:
        ms = []
    if not ms or any(not 1 <= m <= MAX_ROWS for m in ms):
        p.error(f"--ms: comma-separated row counts from 1 to {MAX_ROWS}, not {args.ms!r}")
    if not torch.cuda.is_available():
        print("bench/micro_w4_rows.py needs a CUDA GPU", file=sys.stderr)
        return 2
    bw = copy_bandwidth_gbps()
    print(f"copy bandwidth {bw:.0f} GB/s", flush=True)
    results = []
    for shape in args.shapes.split(","):
        for m in ms:
            best = dict.fromkeys(only, 0.0)
            for name in args.layers.split(","):
                k, n = LAYERS[shape][name]
                rows = time_layer(k, n, m, only)
                for r in rows:
                    r["layer"] = f"{shape}.{name}"
                    times = "  ".join(f"{src} {r[f'{src}_us']:7.2f}" for src in only)
                    print(f"  {r['layer']:<30} m={m:<3} {r['config']:<28} {times} us", flush=True)
                results += rows
                for src in best:
                    fastest = min(rows, key=lambda r, s=src: r[f"{s}_us"])
                    best[src] += fastest[f"{src}_us"]
                    print(f"  {shape}.{name} m={m} best {src}: {fastest[f'{src}_us']:.2f} us "
                          f"({fastest['config']})", flush=True)  # fmt: skip
            sums = ", ".join(f"{src} {us:.1f} us" for src, us in best.items())
            print(f"{shape} m={m}: one layer's four, best config each: {sums}", flush=True)
    write_result(args.out, "micro-w4-rows", "micro_w4_rows.py",
                 {"copy_bandwidth_gbps": bw, "rows": results}, indent=1)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
