"""What a torch.profiler session leaves behind: the decode step timed before and after it.

    python3 bench/profiler_residue.py --out bench/results

bench/decode.py profiles one decode step of each nib graph row (kernels per step, their
summed time) in the same process that times the rows after it. Kineto leaves CUPTI
attached when a profile ends unless TEARDOWN_CUPTI=1 (pytorch/pytorch#144455), and in
the 2026-12-03 decode run every step-tuning measure taken after the first row's profile
sat 55-90 µs above the same step timed in a process that never profiled. This script
times it: for TEARDOWN_CUPTI=0 and =1, each in its own process, the shape's INT4 model
is built and tuned as bench/decode.py builds it, its graphs captured, and the greedy
decode step is timed (the step tuner's measure, and 50 replays of the captured decode
graph) before any profile, after one profile of decode.py's, and after a second one
(the second CUPTI start after a teardown is where CUDA graphs once crashed).

Writes bench/results/<date>-profiler-residue.json (date, device, torch, command, rows:
one per shape and TEARDOWN_CUPTI value with µs per step at each stage).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import write_result

STAGES = ("before", "after-one-profile", "after-two-profiles")
REPS = 5


def child(shape: str) -> dict[str, object]:
    import decode  # bench/decode.py: the same model builder, tuning and profile
    from step_timeline import TEST_SHAPES

    from nib.engine.step_tuning import step_us

    decode.SHAPES.update(TEST_SHAPES)
    runner, _tuned = decode.tuned_runner(shape, True, 1024)
    runner.capture()  # type: ignore[attr-defined]
    position = 576 if runner.max_context > 640 else runner.max_context // 2  # type: ignore[attr-defined]
    stages: dict[str, dict[str, object]] = {}
    for i, stage in enumerate(STAGES):
        if i:
            decode.profile_decode_step(runner, position)
        steps = [step_us(runner) for _ in range(REPS)]
        graph = runner.graphs[runner._decode_name(0, True)]  # type: ignore[attr-defined]
        replays = [decode.replay_graph_us(runner, graph) for _ in range(REPS)]
        stages[stage] = {
            "step_us": steps,
            "step_us_median": statistics.median(steps),
            "replay_us": replays,
            "replay_us_median": statistics.median(replays),
        }
    return {
        "shape": shape,
        "teardown_cupti": os.environ.get("TEARDOWN_CUPTI", ""),
        "stages": stages,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--shapes", default="qwen2.5-coder-1.5b")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("profiler_residue.py needs a CUDA GPU", file=sys.stderr)
        return 2
    if args.child:
        print("RESULT " + json.dumps(child(args.child)), flush=True)
        return 0
    rows: list[dict[str, object]] = []
    for shape in args.shapes.split(","):
        for teardown in ("0", "1"):
            env = {**os.environ, "TEARDOWN_CUPTI": teardown}
            proc = subprocess.run(
                [sys.executable, __file__, "--child", shape],
                env=env, capture_output=True, text=True, check=False, timeout=1200,
            )  # fmt: skip
            lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
            if proc.returncode or not lines:
                print(proc.stdout[-2000:] + proc.stderr[-4000:], file=sys.stderr)
                print(f"{shape} with TEARDOWN_CUPTI={teardown}: rc {proc.returncode}")
                rows.append({"shape": shape, "teardown_cupti": teardown, "failed": proc.returncode})
                continue
            row = json.loads(lines[-1][len("RESULT ") :])
            rows.append(row)
            print(
                f"{shape} TEARDOWN_CUPTI={teardown}: "
                + ", ".join(
                    f"{s} step {v['step_us_median']:.1f} / replay {v['replay_us_median']:.1f} us"
                    for s, v in row["stages"].items()
                ),
                flush=True,
            )
            if args.out:
                write_result(args.out, "profiler-residue", "profiler_residue.py", {"rows": rows})
    return 1 if any("failed" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
