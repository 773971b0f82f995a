"""Launch one 16-bit layer's CUDA GEMV a few times, for a profiler (ncu) to look at.

    ncu --clock-control none --section SpeedOfLight --section WarpStateStats \
        python3 tools/profile_gemv16.py --k 1536 --n 151936 --cfg 2,4,4,2,1 --fusion norm

cfg: rows,warps,unroll,per_warp,split_k (engine/cuda/gemv16.py's Gemv16Config). The
weights are random bf16; copies rotate so that the profiled launches read from memory,
not L2. The INT4 kernel's counterpart is tools/profile_w4a16.py.
"""

from __future__ import annotations

import argparse

import torch

from nib.engine.cuda import gemv16
from nib.engine.cuda.gemv16 import EPI_PLAIN, EPI_RESIDUAL, Gemv16Config


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--k", type=int, required=True)
    p.add_argument("--n", type=int, required=True)
    p.add_argument("--cfg", required=True, help="rows,warps,unroll,per_warp,split_k")
    p.add_argument("--fusion", default="", choices=["", "norm", "residual"])
    p.add_argument("--launches", type=int, default=6)
    args = p.parse_args()
    r, w, u, t, s = (int(v) for v in args.cfg.split(","))
    cfg = Gemv16Config(r, w, u, per_warp=t, split_k=s)
    dt = torch.bfloat16
    weights = [torch.randn(args.n, args.k, device="cuda", dtype=dt) / args.k**0.5 for _ in range(4)]
    x = torch.randn(args.k, device="cuda", dtype=dt)
    nw = torch.ones(args.k, device="cuda", dtype=dt) if args.fusion == "norm" else None
    out = torch.zeros(args.n, device="cuda", dtype=dt)
    buffers = gemv16.split_buffers(args.n, cfg, x.device)
    epi = EPI_RESIDUAL if args.fusion == "residual" else EPI_PLAIN
    for i in range(args.launches):
        gemv16.launch(x, weights[i % 4], None, out, args.n, cfg, nw, 1e-6, epi, buffers=buffers)
    torch.cuda.synchronize()
    print("launched", args.launches, cfg.label())


if __name__ == "__main__":
    main()
