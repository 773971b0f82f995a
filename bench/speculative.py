"""Prompt-lookup speculative decoding: tokens per second with and without drafts.

    python3 bench/speculative.py                                   # shipped model, CPU
    python3 bench/speculative.py --device cuda                     # shipped model, GPU
    python3 bench/speculative.py --device cuda --shape llama-2-7b  # verify cost at 7B

Two kinds of prompt: edit-like (the completion repeats code already in the
context: a second call with the same arguments, a renamed copy of a block)
and fresh code. For each: greedy tokens per second with speculation off and
on, and the share of drafted tokens accepted. On a GPU it also times one
verify graph replay (8 tokens) against one decode step. Random-init shapes
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


def run(engine, text: str, new: int) -> tuple[float, int]:  # type: ignore[no-untyped-def]
    from nib.engine.request import DoneEvent, Event, GenerationParams, Prompt

    events: queue.Queue[Event] = queue.Queue()
    ids = engine.encode_prompt(Prompt(text=text))
    engine.submit(ids, GenerationParams(max_tokens=new), events.put, "b")
    while not isinstance(ev := events.get(timeout=300), DoneEvent):
        pass
    decode_s = (ev.timings.total_ms - ev.timings.ttft_ms) / 1e3
    return decode_s, ev.usage.completion_tokens


def verify_cost(engine) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """µs of one verify-8 graph replay and one decode graph replay, back to back."""
    runner = engine.runner
    out = {}
    for name in ("decode-greedy-0", "verify-8"):
        graph = runner.graphs.get(name)
        if graph is None:
            continue
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(runner.stream):
            runner.pos.fill_(200)
            start.record()
            for _ in range(20):
                graph.replay()
            end.record()
        end.synchronize()
        out[name] = start.elapsed_time(end) * 1e3 / 20
    return {
        "decode_step_us": out.get("decode-greedy-0", 0.0),
        "verify8_step_us": out.get("verify-8", 0.0),
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
                decode_s, tokens = run(engine, text, args.new)
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
