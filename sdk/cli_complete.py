"""`nib complete`: stream one completion to the terminal, as text or as JSON lines."""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
from typing import Any, TextIO

from nib.sdk.client import Client
from nib.sdk.state import StreamState

EXIT_INTERRUPTED = 130  # the shell's convention for "ended by SIGINT"
_ESCAPE = re.compile(r"\\(n|t|\\)")


def unescape(text: str) -> str:
    r"""`\n`, `\t` and `\\` typed on a command line become newline, tab and backslash."""
    return _ESCAPE.sub(lambda m: {"n": "\n", "t": "\t", "\\": "\\"}[m.group(1)], text)


def summary(stream: StreamState) -> dict[str, Any]:
    t, u = stream.timings, stream.usage
    return {
        "type": "done",
        "request_id": stream.request_id,
        "finish_reason": str(stream.finish_reason),
        "stop": stream.stop,
        "text": stream.text,
        "usage": vars(u),
        "timings": {
            "queue_ms": t.queue_ms,
            "ttft_ms": t.ttft_ms,
            "total_ms": t.total_ms,
            "client_first_text_ms": (
                None if stream.first_delta_s is None else stream.first_delta_s * 1000
            ),
            "inter_token_ms": list(t.inter_token_ms),
        },
        "attempts": stream.attempts,
    }


def timing_line(stream: StreamState) -> str:
    """One human line: what ended it, token counts, where the time went."""
    u, t = stream.usage, stream.timings
    if stream.cancelled:
        return f"[cancelled] after {len(stream.token_ids)} tokens"
    parts = [
        f"[{stream.finish_reason}] {u.prompt_tokens} prompt + {u.completion_tokens} completion tokens",
        f"queue {t.queue_ms:.1f} ms",
        f"ttft {t.ttft_ms:.1f} ms",
    ]
    if stream.first_delta_s is not None:
        parts.append(f"first text here after {stream.first_delta_s * 1000:.1f} ms")
    parts.append(f"total {t.total_ms:.1f} ms")
    if t.inter_token_ms:
        rate = 1000 * len(t.inter_token_ms) / max(sum(t.inter_token_ms), 1e-9)
        parts.append(
            f"decode {rate:.1f} tok/s (inter-token p50 {statistics.median(t.inter_token_ms):.1f} ms)"
        )
    return ", ".join(parts)


def run_complete(client: Client, args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    prompt: str = sys.stdin.read() if args.prompt == "-" else args.prompt
    fim = args.suffix is not None
    stream = client.complete(
        None if fim else prompt,
        prefix=prompt if fim else None,
        suffix=args.suffix,
        path=args.path,
        language=args.language,
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        stop=[unescape(s) for s in args.stop],
    )
    try:
        for text in stream:
            if args.json:
                out.write(json.dumps({"type": "delta", "text": text}) + "\n")
            else:
                out.write(text)
            out.flush()
    except KeyboardInterrupt:
        stream.cancel()  # the server stops generating within one decode step
        if args.json:
            out.write(json.dumps(summary(stream)) + "\n")
        else:
            out.write("\n")
            print(timing_line(stream), file=sys.stderr)
        out.flush()
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        stream.cancel()  # e.g. `nib complete ... | head -c 100`: nobody reads any more
        # Python flushes stdout again at exit; point it at /dev/null so that stays quiet.
        os.dup2(os.open(os.devnull, os.O_WRONLY), out.fileno())
        return 0
    if args.json:
        out.write(json.dumps(summary(stream)) + "\n")
    else:
        out.write("\n")
        if args.verbose:
            print(timing_line(stream), file=sys.stderr)
    out.flush()
    return 0
