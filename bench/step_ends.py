"""What the decode step's two ends cost: PyTorch's kernels there against nib's, in one process.

    python3 bench/step_ends.py --out bench/results

A greedy decode step began with PyTorch's embedding lookup and advanced the position
with a PyTorch add between the lm_head and the greedy pick. Neither kernel launches
the next one early, so the first q/k/v GEMV and the pick each started only after
them (bench/step_timeline.py: the pick's first block began ~2.7 µs after the
lm_head's last had ended). Now the embedding is engine/cuda/embed.cu and the greedy
kernel advances the position itself (GraphRunner.embed, GraphRunner.greedy_advances).

For each shape and format the model is built as bench/decode.py builds it and
start-up's step tuning runs once; then the greedy decode step is timed with the
step tuner's own measure (engine/step_tuning.step_us: a graph of 8 decode steps at
a mid-context position, the median of 15 replays) for
  - `pytorch-ends`: PyTorch's embedding, the position added before the pick;
  - `nib-ends`: nib's embedding kernel, the pick advancing the position;
alternating, --rounds rounds, and the profiler counts each variant's kernels in one
eager step. Same weights, same configs: the difference is the two ends alone.
Writes bench/results/<date>-step-ends.json (date, device, torch, command, rows: one
per shape, format and variant with its per-round µs, their median and the kernels
per step; `saved_us`: pytorch-ends minus nib-ends, per shape and format).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import write_result

VARIANTS = ("pytorch-ends", "nib-ends")


def set_variant(runner: object, variant: str, embed: object) -> None:
    runner.embed = embed if variant == "nib-ends" else None  # type: ignore[attr-defined]
    runner.greedy_advances = variant == "nib-ends"  # type: ignore[attr-defined]
    # The ends alone: the pick stays a kernel of its own in both (bench/fused_pick.py
    # times it folded into the lm_head).
    runner.fuse_pick = False  # type: ignore[attr-defined]


def kernels_per_step(runner: object) -> int:
    """Kernels one eager greedy decode step launches (bench/decode.py's profile)."""
    import decode

    return round(decode.profile_decode_step(runner, 256)["kernels_per_step"])


def measure(
    shape: str,
    fmt: str,
    rounds: int,
    variants: tuple[str, ...] = VARIANTS,
    setter: Callable[[object, str, object], None] = set_variant,
    final: str = "nib-ends",
) -> list[dict[str, object]]:
    """Rows of `variants` (setter(runner, variant, nib's embedding) applies one), timed
    alternating for `rounds` rounds on one tuned runner; `final` is applied last."""
    import decode  # bench/decode.py: the same model builder and kernels
    from step_timeline import TEST_SHAPES  # tiny-llama, for tests/gpu

    from nib.engine.step_tuning import step_us

    decode.SHAPES.update(TEST_SHAPES)
    runner, tuned = decode.tuned_runner(shape, fmt == "int4", 1024)
    embed = runner.embed
    if embed is None or runner.greedy is None:
        raise SystemExit("this bench needs nib's CUDA kernels (embedding and greedy pick)")
    times: dict[str, list[float]] = {v: [] for v in variants}
    for _ in range(rounds):
        for variant in variants:
            setter(runner, variant, embed)
            times[variant].append(step_us(runner, steps=8, reps=15))
    rows = []
    for variant in variants:
        setter(runner, variant, embed)
        rows.append(
            {
                "shape": shape,
                "format": fmt,
                "variant": variant,
                "step_us_rounds": times[variant],
                "step_us_median": statistics.median(times[variant]),
                "kernels_per_step": kernels_per_step(runner),
                "step_tuning": tuned,
            }
        )
    setter(runner, final, embed)
    del runner
    gc.collect()
    torch.cuda.empty_cache()
    return rows


def print_rows(rows: list[dict[str, object]]) -> None:
    """A line per variant: its median, kernels a step and every round."""
    for r in rows:
        print(
            f"   {r['variant']:13s} {r['step_us_median']:8.1f} us/step "
            f"({r['kernels_per_step']} kernels), rounds "
            + " ".join(f"{t:.1f}" for t in r["step_us_rounds"]),  # type: ignore[attr-defined]
            flush=True,
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--shapes", default="llama-2-7b,qwen2.5-coder-1.5b")
    ap.add_argument("--formats", default="int4,bf16", help="int4 (fp16 activations) and/or bf16")
    ap.add_argument("--rounds", type=int, default=5, help="alternations of the two variants")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    if not torch.cuda.is_available():
        print("step_ends.py needs a CUDA GPU", file=sys.stderr)
        return 2
    rows: list[dict[str, object]] = []
    saved: dict[str, float] = {}
    for shape in args.shapes.split(","):
        for fmt in args.formats.split(","):
            if fmt not in ("int4", "bf16"):
                ap.error(f"--formats: {fmt!r} is not int4 or bf16")
            print(f"== {shape} {fmt}", flush=True)
            pair = measure(shape, fmt, args.rounds)
            rows += pair
            median = {str(r["variant"]): float(r["step_us_median"]) for r in pair}  # type: ignore[arg-type]
            saved[f"{shape} {fmt}"] = median["pytorch-ends"] - median["nib-ends"]
            print_rows(pair)
            if args.out:  # what has been measured survives a later row's failure
                write_result(
                    args.out, "step-ends", "step_ends.py", {"rows": rows, "saved_us": saved}
                )
    print("| shape | format | pytorch ends µs | nib ends µs | saved µs |")
    print("|---|---|---:|---:|---:|")
    for key, value in saved.items():
        shape, fmt = key.split(" ")
        by = {str(r["variant"]): r for r in rows if r["shape"] == shape and r["format"] == fmt}
        print(
            f"| {shape} | {fmt} | {by['pytorch-ends']['step_us_median']:.1f} "
            f"| {by['nib-ends']['step_us_median']:.1f} | {value:+.1f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
