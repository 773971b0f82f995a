"""Launch one INT4 layer's kernel a few times, for a profiler (ncu) to look at.

    ncu --clock-control none --section SpeedOfLight --section WarpStateStats \
        python3 tools/profile_w4a16.py --k 4096 --n 12288 --cfg 1,4,3,1,0 --fusion norm

cfg: r,warps,pf,splits,bulk (engine/cuda/w4a16.py's W4Config). Weights are random
codes; copies rotate so that the profiled launches read from memory, not L2. --m 2..16
launches the plain product of that many fp16 rows (the w4a16_m1/m2 `g` kernels, what
bench/int4_linear.py times at M = 4 and 16) instead of the one-row fused variant.
"""

from __future__ import annotations

import argparse

import torch

from nib.engine.cuda.int4_swap import fused_call
from nib.engine.cuda.w4a16 import MAX_ROWS, CudaInt4, W4Config


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--k", type=int, required=True)
    p.add_argument("--n", type=int, required=True)
    p.add_argument("--cfg", required=True, help="r,warps,pf,splits,bulk")
    p.add_argument("--fusion", default="", choices=["", "norm", "residual", "norm_glu"])
    p.add_argument("--launches", type=int, default=6)
    p.add_argument(
        "--m", type=int, default=1, help=f"activation rows (2..{MAX_ROWS}: plain product)"
    )
    args = p.parse_args()
    if not 1 <= args.m <= MAX_ROWS:
        p.error(f"--m must be 1..{MAX_ROWS}, got {args.m}")
    if args.m > 1 and args.fusion:
        p.error("--m > 1 runs the plain product: leave --fusion out")
    r, w, pf, s, b = (int(v) for v in args.cfg.split(","))
    cfg = W4Config(r, w, pf, s, bool(b))
    codes = torch.randint(0, 16, (args.n, args.k), device="cuda", dtype=torch.uint8)
    scales = (torch.rand(args.k // 128, args.n, device="cuda") * 0.02 + 0.001).half()
    base = CudaInt4(codes, scales, None, args.fusion, "profiled", torch.float16)
    copies = [base] + [base.clone() for _ in range(3)]
    if args.m == 1:
        x = torch.randn(args.k, device="cuda", dtype=torch.float16)
        scratch = torch.zeros(base.n, device="cuda", dtype=torch.float16)
        calls = [fused_call(layer, cfg, x, scratch) for layer in copies]
    else:
        x = torch.randn(args.m, args.k, device="cuda", dtype=torch.float16)
        calls = [lambda layer=layer: layer.linear(x, cfg) for layer in copies]
    for i in range(args.launches):
        calls[i % len(calls)]()
    torch.cuda.synchronize()
    print("launched", args.launches, base.effective(cfg, args.m).label(), "m =", args.m)


if __name__ == "__main__":
    main()
