"""Launch one INT4 layer's kernel a few times, for a profiler (ncu) to look at.

    ncu --clock-control none --section SpeedOfLight --section WarpStateStats \
        python3 tools/profile_w4a16.py --k 4096 --n 12288 --cfg 1,4,3,1,0 --fusion norm

cfg: r,warps,pf,splits,bulk (engine/cuda/w4a16.py's W4Config). Weights are random
codes; copies rotate so that the profiled launches read from memory, not L2.
"""

from __future__ import annotations

import argparse

import torch

from nib.engine.cuda.int4_swap import fused_call
from nib.engine.cuda.w4a16 import CudaInt4, W4Config


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--k", type=int, required=True)
    p.add_argument("--n", type=int, required=True)
    p.add_argument("--cfg", required=True, help="r,warps,pf,splits,bulk")
    p.add_argument("--fusion", default="", choices=["", "norm", "residual", "norm_glu"])
    p.add_argument("--launches", type=int, default=6)
    args = p.parse_args()
    r, w, pf, s, b = (int(v) for v in args.cfg.split(","))
    cfg = W4Config(r, w, pf, s, bool(b))
    codes = torch.randint(0, 16, (args.n, args.k), device="cuda", dtype=torch.uint8)
    scales = (torch.rand(args.k // 128, args.n, device="cuda") * 0.02 + 0.001).half()
    base = CudaInt4(codes, scales, None, args.fusion, "profiled", torch.float16)
    x = torch.randn(args.k, device="cuda", dtype=torch.float16)
    scratch = torch.zeros(base.n, device="cuda", dtype=torch.float16)
    copies = [base] + [base.clone() for _ in range(3)]
    calls = [fused_call(layer, cfg, x, scratch) for layer in copies]
    for i in range(args.launches):
        calls[i % len(calls)]()
    torch.cuda.synchronize()
    print("launched", args.launches, base.effective(cfg, 1).label())


if __name__ == "__main__":
    main()
