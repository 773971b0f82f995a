"""Prompt tokenising in an editing session: whole prompts against SessionTokens.

    python3 bench/tokenize_reuse.py                                    # the shipped model's tokenizer
    python3 bench/tokenize_reuse.py --source engine/engine.py --max-chars 30000  # a longer file

Replays bench/typing_trace.py's trace (a file, engine/prefix_cache.py unless
--source says another, typed in bursts, every 12th pause an edit near the top) and tokenises the document at every pause twice: whole
(Tokenizer.encode, what a prompt costs without a session) and through one
SessionTokens as an editor's session does (engine.encode_prompt with a session id).
Both must give the same ids at every pause (the script fails otherwise). Reports
medians and p90 of the time per prompt, and the share of bytes not tokenised again.
Writes bench/results/<date>-tokenize-reuse-cpu.json (rows merged by tokenizer, source
and max_chars). CPU only: tokenising never touches the GPU.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from common import cpu_name, percentile  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--max-chars", type=int, default=8000)
    parser.add_argument("--source", type=Path, help="the file typed (default: typing_trace's)")
    parser.add_argument("--tokenizer", type=Path, help="tokenizer.json or model folder")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    import typing_trace

    from nib.engine.default_model import default_model_dir
    from nib.engine.tokenizer import SessionTokens, Tokenizer

    source = args.tokenizer or default_model_dir()
    tok = Tokenizer(source)
    if args.source is not None:
        typing_trace.SOURCE = args.source.resolve()
    pauses = typing_trace.trace(max_chars=args.max_chars)
    cache = SessionTokens(tok)
    whole_us, session_us, total_bytes = [], [], 0
    for doc in pauses:
        started = time.perf_counter()
        expected = tok.encode(doc)
        whole_us.append((time.perf_counter() - started) * 1e6)
        started = time.perf_counter()
        got = cache.encode(doc, "editor")
        session_us.append((time.perf_counter() - started) * 1e6)
        if got != expected:
            print(f"MISMATCH at a {len(doc)}-character prompt", file=sys.stderr)
            return 1
        total_bytes += len(doc.encode())
    row = {
        "tokenizer": "shipped" if args.tokenizer is None else str(args.tokenizer),
        "source": str(typing_trace.SOURCE.relative_to(ROOT)),
        "max_chars": args.max_chars,
        "prompts": len(pauses),
        "chars_median": statistics.median(len(d) for d in pauses),
        "whole_us_median": statistics.median(whole_us),
        "whole_us_p90": percentile(whole_us, 0.9),
        "session_us_median": statistics.median(session_us),
        "session_us_p90": percentile(session_us, 0.9),
        "bytes_reused_share": cache.reused_bytes / total_bytes,
        "splices": cache.splices,
        "ids_equal": True,
    }
    print(json.dumps(row))
    today = dt.date.today().isoformat()
    path = args.out / f"{today}-tokenize-reuse-cpu.json"
    args.out.mkdir(parents=True, exist_ok=True)
    result = json.loads(path.read_text()) if path.exists() else {"date": today, "rows": []}

    def key(r: dict[str, object]) -> tuple[object, ...]:
        return r["tokenizer"], r.get("source"), r["max_chars"]

    result["rows"] = [r for r in result["rows"] if key(r) != key(row)]
    result["rows"].append(row)
    result["device"] = cpu_name()
    result.setdefault("commands", [])
    command = "python3 bench/tokenize_reuse.py " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    if command.strip() not in [c.strip() for c in result["commands"]]:
        result["commands"].append(command)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
