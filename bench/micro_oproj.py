"""Where the fused attention + o_proj's time goes: the kernel alone against its parts.

    python3 bench/micro_oproj.py --out bench/results

Qwen2.5-Coder-1.5B's attention half after the q/k/v GEMV, 28 layers (each its own
KV cache and o_proj weight, so nothing comes from L2) back to back in one CUDA graph
(engine/cuda/timing.graph_us), at one position, µs a layer:
  - `separate`: the cluster attention kernel (attention.py, 2 KV heads x 8 splits),
    then the o_proj GEMV with the residual add (w4a16.cu r1w16p4);
  - `attention only`: the first of those alone;
  - `fused, weights in registers` / `fused, weights in L2`: attention_oproj.py's one
    launch, the o_proj's weights loaded into registers at the start / prefetched into
    L2 at the start and loaded once the block's positions are attended;
  - `fused, no o_proj tiles`: the same launch with no tiles a block: the cluster of 16,
    its two extra cluster-wide barriers and the output pushed into every block, without
    the product.
Writes bench/results/<date>-micro-oproj.json (date, device, torch, command, rows:
variant, position, us_per_layer).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import write_result

LAYERS = 28
H, KVH, D, HIDDEN = 12, 2, 128, 1536


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--positions", default="639,4095")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("micro_oproj.py needs a CUDA GPU", file=sys.stderr)
        return 2
    from nib.engine.cuda.attention import FusedDecodeAttention
    from nib.engine.cuda.attention_oproj import FusedAttentionOproj
    from nib.engine.cuda.timing import graph_us
    from nib.engine.cuda.w4a16 import CudaInt4, W4Config

    dev, dtype, s = torch.device("cuda"), torch.float16, 4096
    torch.manual_seed(0)
    qkv = torch.randn(1, 1, (H + 2 * KVH) * D, device=dev).to(dtype)
    caches = [
        (
            torch.randn(1, KVH, s, D, device=dev).to(dtype),
            torch.randn(1, KVH, s, D, device=dev).to(dtype),
        )
        for _ in range(LAYERS)
    ]
    wos = []
    for _ in range(LAYERS):
        codes = torch.randint(0, 16, (HIDDEN, H * D), device=dev, dtype=torch.uint8)
        scales = (torch.rand(H * D // 128, HIDDEN, device=dev) * 0.02 + 0.001).half()
        wo = CudaInt4(codes, scales, None, "residual", "o_proj", dtype)
        wo.one_row = W4Config(1, 16, 4)
        wos.append(wo)
    inv = 1.0 / (10000 ** (torch.arange(0, D, 2, device=dev).float() / D))
    emb = torch.outer(torch.arange(s, device=dev).float(), inv).repeat(1, 2)
    cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
    residual = torch.randn(HIDDEN, device=dev).to(dtype)
    out = torch.empty(1, H, 1, D, device=dev, dtype=dtype)
    attention = FusedDecodeAttention(H, KVH, D, s, dtype, dev)
    fused = FusedAttentionOproj(H, KVH, D, HIDDEN, s, dtype, dev)
    rows: list[dict[str, object]] = []
    for p in (int(x) for x in args.positions.split(",")):
        pos = torch.tensor([p], device=dev)

        def separate(i: int, alone: bool = False, pos: torch.Tensor = pos) -> None:
            attention(qkv, pos, cos, sin, *caches[i], out=out)
            if not alone:
                wos[i].residual(out.reshape(-1), residual)

        def one(i: int, pos: torch.Tensor = pos) -> None:
            fused(qkv, pos, cos, sin, *caches[i], wos[i], residual)

        variants = {
            "separate": lambda i: separate(i),
            "attention only": lambda i: separate(i, alone=True),
            "fused, weights in registers": one,
            "fused, weights in L2": one,
            "fused, no o_proj tiles": one,
        }
        for name, fn in variants.items():
            fused.mode = "registers" if "registers" in name else "l2"
            tiles = fused.tiles_per_block
            if "no o_proj" in name:
                fused.tiles_per_block = 0  # the launch's product and epilogue do nothing
            us = graph_us([lambda i=i, fn=fn: fn(i) for i in range(LAYERS)], calls=2 * LAYERS)
            fused.tiles_per_block = tiles
            rows.append({"variant": name, "position": p, "us_per_layer": us})
            print(f"  p={p:5d}  {name:30s} {us:7.2f} us a layer", flush=True)
    if args.out:
        write_result(args.out, "micro-oproj", "micro_oproj.py", {"rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
