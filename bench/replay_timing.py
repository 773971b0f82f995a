"""How steady start-up's decode-step measure is, with and without the graph's launch in it.

    python3 bench/replay_timing.py --out bench/results

Start-up picks each layer shape's INT4 config by timing the whole decode step
(engine/step_tuning.py), one option after another, each timed once by
engine/cuda/timing.replay_us. Until 2026-12-03 that measure put an event on an idle
GPU, launched the graph and put another event behind it, so the host's launch of the
graph (and its jitter) sat inside every interval; it now runs the replays back to back
behind a spin kernel (`hide_launch`). For each shape (INT4, built as bench/decode.py
builds it, the per-shape config ranking done once) this script:

  - times the step at the per-shape picks with both measures, alternating, --rounds
    rounds (`launch-inclusive`, `launch-hidden`): median, range;
  - runs the step tuning --tunings times with each measure, alternating, every one from
    the per-shape picks: what it chose, its before / after, how long it took;
  - times every distinct set of choices those tunings made (and the per-shape picks)
    with the steadier measure over a longer graph (8 steps, 15 replays), alternating,
    --rounds rounds: which measure's tunings chose the faster step.

Writes bench/results/<date>-replay-timing.json (date, device, torch, command, rows: one
per shape with `measure_rounds`, `tunings` and `picks`).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import write_result

MEASURES = {"launch-inclusive": False, "launch-hidden": True}  # name -> hide_launch


def spread(values: list[float]) -> dict[str, float]:
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "range": max(values) - min(values),
    }


def picks_us(sets: list[dict[str, Any]], runs: list[dict[str, Any]], measure: str) -> list[float]:
    """The 8 x 15 step time of each tuning's choices, for the tunings run with `measure`
    (in the order of `sets`, the distinct choices; `from`: the tunings that made each)."""
    return [
        s["step_us_median"]
        for s in sets
        for j in s["from"]
        if j != "per-shape" and runs[j]["measure"] == measure
    ]


def measure_shape(shape: str, rounds: int, tunings: int) -> dict[str, object]:
    import decode  # bench/decode.py: the same model builder and kernels
    from cuda_variants import current_configs, restore_configs
    from step_timeline import TEST_SHAPES  # tiny-llama, for tests/gpu

    from nib.engine.step_tuning import _config_knobs, step_us, tune

    decode.SHAPES.update(TEST_SHAPES)
    runner = decode.graph_runner(shape, True, 1024)
    model = runner.model  # type: ignore[attr-defined]
    base = current_configs(model)  # the per-shape picks, before any step tuning

    samples: dict[str, list[float]] = {m: [] for m in MEASURES}
    for _ in range(rounds):
        for name, hide in MEASURES.items():
            samples[name].append(step_us(runner, hide_launch=hide))
    print(f"   at the per-shape picks, {rounds} rounds:", flush=True)
    for name, values in samples.items():
        s = spread(values)
        print(f"     {name:17s} median {s['median']:7.1f} us, range {s['range']:6.1f}", flush=True)

    runs: list[dict[str, object]] = []
    for i in range(tunings):
        for name, hide in MEASURES.items():
            restore_configs(model, base)
            knobs = _config_knobs(model)
            started = time.perf_counter()
            first, last, reverted = tune(knobs, lambda h=hide, r=runner: step_us(r, hide_launch=h))
            chosen = {k.name: k.label(k.options[k.chosen]) for k in knobs}
            runs.append(
                {
                    "measure": name, "round": i, "before_us": first, "after_us": last,
                    "reverted": reverted, "chosen": chosen,
                    "seconds": time.perf_counter() - started,
                }
            )  # fmt: skip
            print(f"   tuning {i} ({name}): {first:.1f} -> {last:.1f} us{' reverted' if reverted else ''}: "
                  + ", ".join(f"{k.split(' +')[0]}={v.replace('int4 mma16 ', '')}"
                              for k, v in chosen.items()), flush=True)  # fmt: skip

    restore_configs(model, base)
    per_shape = {k.name: k.label(k.options[0]) for k in _config_knobs(model)}
    sets: list[dict[str, object]] = [{"configs": per_shape, "from": ["per-shape"]}]
    for j, run in enumerate(runs):
        for s in sets:
            if s["configs"] == run["chosen"]:
                s["from"].append(j)  # type: ignore[attr-defined]
                break
        else:
            sets.append({"configs": run["chosen"], "from": [j]})
    for s in sets:
        s["step_us_rounds"] = []
    for _ in range(rounds):
        for s in sets:
            restore_configs(model, base)
            decode.force_configs(model, [f"{k}={v}" for k, v in s["configs"].items()])  # type: ignore[attr-defined]
            s["step_us_rounds"].append(step_us(runner, steps=8, reps=15))  # type: ignore[attr-defined]
    for s in sets:
        s["step_us_median"] = statistics.median(s["step_us_rounds"])  # type: ignore[arg-type]
    for name in MEASURES:
        chosen_times = picks_us(sets, runs, name)
        print(f"   {name} tunings' picks, timed 8 steps x 15: "
              + " ".join(f"{t:.1f}" for t in chosen_times), flush=True)  # fmt: skip
    del runner, model
    gc.collect()
    torch.cuda.empty_cache()
    return {
        "shape": shape,
        "format": "int4",
        "measure_rounds": {n: {"us": v, **spread(v)} for n, v in samples.items()},
        "tunings": runs,
        "picks": sets,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--shapes", default="qwen2.5-coder-1.5b,llama-2-7b")
    ap.add_argument("--rounds", type=int, default=7, help="alternations of the measures / picks")
    ap.add_argument("--tunings", type=int, default=3, help="step tunings per measure")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.tunings < 1:
        ap.error("--rounds and --tunings must be at least 1")
    if not torch.cuda.is_available():
        print("replay_timing.py needs a CUDA GPU", file=sys.stderr)
        return 2
    from nib.engine.cuda import loader

    why = loader.unavailable_reason(torch.device("cuda"))
    if why:
        print(f"replay_timing.py needs nib's CUDA kernels: {why}", file=sys.stderr)
        return 2
    rows: list[dict[str, object]] = []
    for shape in args.shapes.split(","):
        print(f"== {shape} int4", flush=True)
        rows.append(measure_shape(shape, args.rounds, args.tunings))
        if args.out:  # what has been measured survives a later shape's failure
            write_result(args.out, "replay-timing", "replay_timing.py", {"rows": rows})
    print(
        "| shape | measure | step µs at per-shape picks (median, range) | tunings' picks, µs (8 x 15) |"
    )
    print("|---|---|---|---|")
    for r in rows:
        for name in MEASURES:
            m = r["measure_rounds"][name]  # type: ignore[index]
            picked = [f"{t:.1f}" for t in picks_us(r["picks"], r["tunings"], name)]  # type: ignore[arg-type]
            print(
                f"| {r['shape']} | {name} | {m['median']:.1f} ({m['range']:.1f}) | {', '.join(picked)} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
