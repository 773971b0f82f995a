"""What running the INT4 o_proj in the attention's launch saves a decode step, in one process.

    python3 bench/fused_oproj.py --out bench/results

A layer of the INT4 decode step ran the fused RoPE + KV write + attention kernel and
then the o_proj GEMV with the residual add: one more dependent kernel boundary, and
a kernel that first reads the attention's output back from memory (on the 1.5B
shape bench/step_timeline.py put the o_proj's share of a layer at ~2.7 µs for 1.2 MB
of weights). engine/cuda/attention_oproj.py does both in the attention's launch: the
attention's cluster holds the o_proj's weights in registers from its start and
multiplies them once its KV heads' outputs are in every block's shared memory.

For each shape the model is built as bench/decode.py builds it (INT4) and start-up's
step tuning runs once (with the fused kernel as one of its knobs); then the greedy
decode step is timed with the step tuner's own measure (engine/step_tuning.step_us),
the configs fixed, for
  - `separate-oproj`: the attention kernel, then the o_proj GEMV;
  - `fused-oproj`: one launch for both;
alternating, --rounds rounds, and the profiler counts each variant's kernels in one
eager step (bench/step_ends.py's measure). Writes bench/results/<date>-fused-oproj.json
(date, device, torch, command, rows: one per shape and variant with its per-round µs,
their median, the kernels per step and the step tuning's choices; `saved_us`:
separate-oproj minus fused-oproj, per shape). Shapes where the fused kernel does not
apply (the 7B's 32 KV heads do not fit one cluster) are reported and skipped.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import write_result

VARIANTS = ("separate-oproj", "fused-oproj", "fused-oproj-registers")


def set_variant(runner: object, variant: str, embed: object) -> None:
    runner.fuse_oproj = variant != "separate-oproj"  # type: ignore[attr-defined]
    fused = runner.fused_oproj  # type: ignore[attr-defined]
    if fused is not None:  # the weights' wait: in L2 (the default), or in registers
        fused.mode = "registers" if variant == "fused-oproj-registers" else "l2"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--shapes", default="qwen2.5-coder-1.5b")
    ap.add_argument("--rounds", type=int, default=5, help="alternations of the two variants")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    if not torch.cuda.is_available():
        print("fused_oproj.py needs a CUDA GPU", file=sys.stderr)
        return 2
    import step_ends

    rows: list[dict[str, object]] = []
    saved: dict[str, float] = {}
    for shape in args.shapes.split(","):
        print(f"== {shape} int4", flush=True)
        pair = step_ends.measure(
            shape, "int4", args.rounds, VARIANTS, set_variant, "fused-oproj", needs="fused_oproj"
        )
        if not pair:
            print("   the fused attention + o_proj does not apply to this shape", flush=True)
            continue
        rows += pair
        median = {str(r["variant"]): float(r["step_us_median"]) for r in pair}  # type: ignore[arg-type]
        saved[shape] = median["separate-oproj"] - median["fused-oproj"]
        step_ends.print_rows(pair)
        if args.out:  # what has been measured survives a later row's failure
            write_result(
                args.out, "fused-oproj", "fused_oproj.py", {"rows": rows, "saved_us": saved}
            )
    print("| shape (INT4) | separate µs | fused µs | saved µs | kernels a step |")
    print("|---|---:|---:|---:|---|")
    for shape, value in saved.items():
        by = {str(r["variant"]): r for r in rows if r["shape"] == shape}
        sep, fused = by["separate-oproj"], by["fused-oproj"]
        print(
            f"| {shape} | {sep['step_us_median']:.1f} | {fused['step_us_median']:.1f} "
            f"| {value:+.1f} | {sep['kernels_per_step']} -> {fused['kernels_per_step']} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
