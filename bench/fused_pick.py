"""What folding the greedy pick into the INT4 lm_head saves a decode step, in one process.

    python3 bench/fused_pick.py --out bench/results

The greedy decode step ended with the lm_head and then the greedy kernel
(engine/cuda/greedy.cu) reading the logits back: one more kernel boundary (the
pick's ~0.7 µs release and its own pass over the row; bench/step_timeline.py put
its share of the step at 5.5-5.9 µs). With the INT4 lm_head on nib's CUDA kernel,
the step can fold the pick into the lm_head's epilogue instead (engine/cuda/pick.cuh,
GraphRunner.fuse_pick): every block of tiles merges its logits' argmax and
logsumexp into a workspace, the last block of each 64 merges theirs and the last of
those writes the token.

For each shape the model is built as bench/decode.py builds it (INT4) and start-up's
step tuning runs once (the pick a kernel of its own, GraphRunner's default); then the
greedy decode step is timed with the step tuner's own measure
(engine/step_tuning.step_us), the configs fixed, for
  - `separate-pick`: the lm_head, then the greedy kernel;
  - `fused-pick`: the pick in the lm_head's epilogue;
alternating, --rounds rounds, and the profiler counts each variant's kernels in one
eager step (bench/step_ends.py's measure: same weights, same configs). Writes
bench/results/<date>-fused-pick.json (date, device, torch, command, rows: one per
shape and variant with its per-round µs, their median and the kernels per step;
`saved_us`: separate-pick minus fused-pick, per shape).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import write_result

VARIANTS = ("separate-pick", "fused-pick")


def set_variant(runner: object, variant: str, embed: object) -> None:
    runner.fuse_pick = variant == "fused-pick"  # type: ignore[attr-defined]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--shapes", default="llama-2-7b,qwen2.5-coder-1.5b")
    ap.add_argument("--rounds", type=int, default=5, help="alternations of the two variants")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    if not torch.cuda.is_available():
        print("fused_pick.py needs a CUDA GPU", file=sys.stderr)
        return 2
    import step_ends

    rows: list[dict[str, object]] = []
    saved: dict[str, float] = {}
    for shape in args.shapes.split(","):
        print(f"== {shape} int4", flush=True)
        pair = step_ends.measure(shape, "int4", args.rounds, VARIANTS, set_variant, "fused-pick")
        rows += pair
        median = {str(r["variant"]): float(r["step_us_median"]) for r in pair}  # type: ignore[arg-type]
        saved[shape] = median["separate-pick"] - median["fused-pick"]
        step_ends.print_rows(pair)
        if args.out:  # what has been measured survives a later row's failure
            write_result(args.out, "fused-pick", "fused_pick.py", {"rows": rows, "saved_us": saved})
    print("| shape (INT4) | separate pick µs | fused pick µs | saved µs | kernels a step |")
    print("|---|---:|---:|---:|---|")
    for shape, value in saved.items():
        by = {str(r["variant"]): r for r in rows if r["shape"] == shape}
        sep, fused = by["separate-pick"], by["fused-pick"]
        print(
            f"| {shape} | {sep['step_us_median']:.1f} | {fused['step_us_median']:.1f} "
            f"| {value:+.1f} | {sep['kernels_per_step']} -> {fused['kernels_per_step']} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
