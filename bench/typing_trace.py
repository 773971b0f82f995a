"""Typing-trace benchmark: time to first token while a Python file is being typed.

    python3 bench/typing_trace.py                       # the shipped model on the CPU
    python3 bench/typing_trace.py --shape qwen2.5-coder-1.5b --device cuda

Replays an editing session on one engine, once with prefix reuse and once
without: a real Python file (this repository's engine/prefix_cache.py) is
typed at the end in bursts of 3-25 characters; at every pause the editor asks
for a fill-in-the-middle completion at the cursor (8 tokens, greedy); every
12th pause first edits a line near the top of the file (which invalidates the
cached prefix from there on). Reports the median and p90 time to first token
and how many prompt tokens had to be computed, and merges its rows into
bench/results/<date>-typing.json.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import queue
import random
import statistics
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "engine" / "prefix_cache.py"


def trace(seed: int = 0, max_chars: int = 3000) -> list[str]:
    """The document at every pause, in order."""
    text = SOURCE.read_text()[:max_chars]
    rng = random.Random(seed)
    typed, pauses, edits = "", [], 0
    cursor = 200  # the file's first lines exist already
    typed = text[:cursor]
    while cursor < len(text):
        cursor = min(len(text), cursor + rng.randint(3, 25))
        typed = text[:cursor]
        if len(pauses) % 12 == 11:
            edits += 1
            lines = typed.split("\n")
            lines[min(3, len(lines) - 1)] += f"  # edit {edits}"
            typed = "\n".join(lines)
            text = typed + text[cursor:]
        pauses.append(typed)
    return pauses


def random_model_dir(shape: str, out: Path) -> Path:
    """A random-init model of a real shape in HF layout, with nib's byte-level tokenizer."""
    sys.path.insert(0, str(ROOT / "bench"))
    from decode import build_hf

    from nib.engine.default_model import write_byte_tokenizer

    hf = build_hf(shape)
    with torch.no_grad():  # special-token rows to zero: greedy runs do not stop at once
        hf.get_input_embeddings().weight[256:] = 0
        hf.get_output_embeddings().weight[256:] = 0
    hf.save_pretrained(out)
    del hf
    torch.cuda.empty_cache()
    write_byte_tokenizer(out)
    return out


def replay(
    model_dir: Path, device: str, reuse: bool, pauses: list[str], max_context: int
) -> dict[str, float]:
    from nib.engine.engine import Engine, EngineConfig
    from nib.engine.request import DoneEvent, Event, GenerationParams, Prompt

    config = EngineConfig(
        model_dir=model_dir, device=device, max_context=max_context,
        prefix_cache_entries=4 if reuse else 0,
    )  # fmt: skip
    engine = Engine(config).start()
    assert engine.wait_ready(600), engine.failure
    infill = engine.tokenizer.fim is not None
    ttfts = []
    for i, doc in enumerate(pauses):
        prompt = Prompt(prefix=doc, suffix="\n") if infill else Prompt(text=doc)
        events: queue.Queue[Event] = queue.Queue()
        engine.submit(
            engine.encode_prompt(prompt),
            GenerationParams(max_tokens=8),
            events.put,
            f"r{i}",
            "editor",
        )
        while not isinstance(ev := events.get(timeout=120), DoneEvent):
            pass
        ttfts.append(ev.timings.ttft_ms)
    computed = engine.prompt_tokens_computed
    engine.stop()
    ttfts.sort()
    return {
        "ttft_ms_median": statistics.median(ttfts),
        "ttft_ms_p90": ttfts[int(0.9 * (len(ttfts) - 1))],
        "prompt_tokens_computed": computed,
        "requests": len(ttfts),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--shape",
        default="nib-tiny-code",
        help="nib-tiny-code (the shipped model) or a bench/decode.py shape",
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--max-chars", type=int, default=3000)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    pauses = trace(max_chars=args.max_chars)
    with tempfile.TemporaryDirectory() as tmp:
        if args.shape == "nib-tiny-code":
            from nib.engine.default_model import default_model_dir

            model_dir = default_model_dir()
        else:
            model_dir = random_model_dir(args.shape, Path(tmp))
        device_name = "cpu" if args.device == "cpu" else torch.cuda.get_device_name(0)
        rows = []
        for reuse in (True, False):
            row = {"device": device_name, "shape": args.shape, "prefix_reuse": reuse}
            row.update(replay(model_dir, args.device, reuse, pauses, max_context=2048))
            print(json.dumps(row), flush=True)
            rows.append(row)
    today = dt.date.today().isoformat()
    path = args.out / f"{today}-typing.json"
    args.out.mkdir(parents=True, exist_ok=True)
    result = json.loads(path.read_text()) if path.exists() else {"date": today, "rows": []}
    keep = [r for r in result["rows"] if (r["device"], r["shape"]) != (device_name, args.shape)]
    result["rows"] = keep + rows
    result.setdefault("commands", [])
    result["commands"].append(
        "python3 bench/typing_trace.py " + " ".join(argv if argv is not None else sys.argv[1:])
    )
    result["torch"] = torch.__version__
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
