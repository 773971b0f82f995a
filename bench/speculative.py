"""Prompt-lookup speculative decoding: tokens per second with and without drafts.

    python3 bench/speculative.py                                   # shipped model, CPU
    python3 bench/speculative.py --device cuda                     # shipped model, GPU
    python3 bench/speculative.py --device cuda --shape llama-2-7b  # verify cost at 7B

Two kinds of prompt: edit-like (the completion repeats code already in the
context: a second call with the same arguments, a renamed copy of a block)
and fresh code. For each: greedy tokens per second with speculation off and
on, and the share of drafted tokens accepted. On a GPU it also reports what start-up
measured: one verify graph replay (8 tokens) against one decode step. Random-init shapes
only say what a verify step costs; acceptance needs the trained model.
Writes bench/results/<date>-speculative.json (rows merged by device+shape).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import queue
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent

PROMPTS = {
    "edit-like": (
        "def area(width, height):\n    return width * height\n\n\n"
        "def perimeter(width, height):\n    return 2 * (width + height)\n\n\n"
        "print(area(3, 4))\nprint(perimeter(3, 4))\n\n\n"
        "def area(width, height):\n    return"
    ),
    "fresh": "import json\n\n\ndef load_settings(path):\n    ",
}


def run(engine, text: str, new: int) -> tuple[float, int, float]:  # type: ignore[no-untyped-def]
    from nib.engine.request import DoneEvent, Event, GenerationParams, Prompt

    events: queue.Queue[Event] = queue.Queue()
    ids = engine.encode_prompt(Prompt(text=text))
    engine.submit(ids, GenerationParams(max_tokens=new), events.put, "b")
    while not isinstance(ev := events.get(timeout=300), DoneEvent):
        pass
    decode_s = (ev.timings.total_ms - ev.timings.ttft_ms) / 1e3
    return decode_s, ev.usage.completion_tokens, ev.timings.ttft_ms


def verify_cost(engine) -> dict[str, object]:  # type: ignore[no-untyped-def]
    """What start-up measured (GraphRunner.measure_step_costs): µs of one decode and one
    8-token verify graph replay, and every verify length's cost in decode steps, which
    decides whether drafting pays on this GPU (Speculator.min_gain)."""
    runner = engine.runner
    return {
        "decode_step_us": runner.step_us.get(1, 0.0),
        "verify8_step_us": runner.step_us.get(8, 0.0),
        "verify_costs": {str(b): round(c, 3) for b, c in runner.verify_costs.items()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shape", default="nib-tiny-code")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--new", type=int, default=96)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    from nib.engine.engine import Engine, EngineConfig

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        if args.shape == "nib-tiny-code":
            from nib.engine.default_model import default_model_dir

            model_dir = default_model_dir()
        else:
            sys.path.insert(0, str(ROOT / "bench"))
            from typing_trace import random_model_dir

            model_dir = random_model_dir(args.shape, Path(tmp))
        for k in (0, 6):
            config = EngineConfig(
                model_dir=model_dir, device=args.device, speculative_k=k, prefix_cache_entries=0
            )
            engine = Engine(config).start()
            assert engine.wait_ready(900), engine.failure
            for kind, text in PROMPTS.items():
                run(engine, text, 8)  # warm-up
                before = dict(engine.speculation_stats)
                decode_s, tokens, ttft_ms = run(engine, text, args.new)
                drafted = engine.speculation_stats["drafted"] - before["drafted"]
                accepted = engine.speculation_stats["accepted"] - before["accepted"]
                row = {
                    "device": args.device
                    if args.device == "cpu"
                    else torch.cuda.get_device_name(0),
                    "shape": args.shape,
                    "prompt": kind,
                    "speculative_k": k,
                    "tokens_per_s": tokens / decode_s if decode_s > 0 else 0.0,
                    # Decode time per token after the first (verify steps hand over bursts,
                    # so this, not the median gap, is what drafts buy).
                    "ms_per_token": decode_s * 1e3 / max(tokens - 1, 1),
                    "ttft_ms": ttft_ms,
                    "completion_tokens": tokens,
                    "acceptance": accepted / drafted if drafted else None,
                    "verifies": engine.speculation_stats["verifies"] - before["verifies"],
                }
                if k and args.device != "cpu":
                    row.update(verify_cost(engine))
                print(json.dumps(row), flush=True)
                rows.append(row)
            engine.stop()
            del engine
            if args.device != "cpu":
                torch.cuda.empty_cache()
    today = dt.date.today().isoformat()
    path = args.out / f"{today}-speculative.json"
    args.out.mkdir(parents=True, exist_ok=True)
    result = json.loads(path.read_text()) if path.exists() else {"date": today, "rows": []}
    key = (rows[0]["device"], args.shape)
    result["rows"] = [r for r in result["rows"] if (r["device"], r["shape"]) != key] + rows
    result.setdefault("commands", []).append(
        "python3 bench/speculative.py " + " ".join(argv if argv is not None else sys.argv[1:])
    )
    result["torch"] = torch.__version__
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
