"""Where a completion's time to first token goes, hop by hop, client to engine and back.

    python3 bench/wire_trace.py --device cpu --stub-ms 3,1.9     # a GPU engine's host path
    python3 bench/wire_trace.py --device cpu                     # the shipped model
    python3 bench/wire_trace.py --shape qwen2.5-coder-1.5b       # GPU host
    python3 bench/wire_trace.py --floor --stub-ms 3,1.9          # gRPC alone: the floor
    python3 bench/wire_trace.py --floor --floor-server sync --client aio --stub-ms 3,1.9
    python3 bench/wire_trace.py --path session --device cpu --stub-ms 3,1.9   # one open Session
    python3 bench/wire_trace.py --shape qwen2.5-coder-1.5b --switch-us 100  # GIL switch, µs

Runs a server in a child process with timestamps along the path of every request
(bench/wire_probes.py: nothing in the service changes), streams greedy completions
from this process through the SDK as bench/wire.py does, and prints the median of
each hop. Both processes stamp with time.perf_counter_ns (CLOCK_MONOTONIC on Linux:
one clock for the machine), so client and server stamps subtract. The engine's time
to first token runs from `submit` to `first_token`; the client's from `client_send`
to `client_first`; the gap between the two is what issue 6 bounds by 1 ms.

--floor serves the same RPC from bench/wire_floor.py instead: gRPC's asyncio server and
an engine thread that only waits, with none of nib's work in between; its gap is the
least any service built this way can add on this machine. --floor-server sync serves it
from grpc.server's thread pool instead of grpc.aio's event loop, and --client aio streams
through the SDK's AsyncClient instead of Client (either with or without --floor), so the
floor can be split between gRPC's server and client flavours. --stub-ms replaces the
model's forward by a wait (GIL released, as a GPU sync) so that the CPU engine's
kernels do not take the cores the hops need (a 2-core machine has no core to spare).
--path session sends every completion as a message on one open Session (the editors'
path) instead of a Complete call each: there `intercept` is the server reading the
start message off the stream, and there is no per-call set-up or interceptor.
--switch-us sets nib's server's GIL switch interval (Python's is 5 ms): whether the
engine thread's first calls wait for the event loop to let go of the GIL; the JSON's
`switch_interval_us` is what the server ran with.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nib.sdk.state import StreamState

ROOT = Path(__file__).resolve().parent.parent
# The path of one request, in order; a hop is the time from one stamp to the next.
ORDER = (
    "client_send",  # before Client.complete()
    "client_called",  # complete() returned: the call is started (the server may
    # already have intercepted it, so this hop can be negative)
    "intercept",  # the server's first interceptor sees the call
    "handler",  # Ledger.open: the handler starts admitting it
    "parsed",  # validated into a CompletionSpec
    "tokenised",  # encode_prompt returned
    "submit",  # Engine.submit: the engine's clock starts (job.arrival)
    "queued",  # submit returned
    "picked",  # the engine thread took the job
    "healed",  # token healing's plan for the prompt's last token
    "prefix_found",  # the prefix cache said how much of the prompt it holds
    "output_ready",  # the token stream's state is built (GPU: the first-token bias is next)
    "prefill",  # the model is called for the prompt
    "first_token",  # the engine's own stamp of its first token (its TTFT ends here)
    "sink",  # _Output.token returned: the event is on its way to the event loop
    "loop_event",  # the event loop has the event (Tracked.events)
    "yielded",  # the handler yields the first Delta to gRPC
    "client_first",  # the SDK took the first token in (token_times[0])
)
WARM_UP = 3


def split(stamps: list[tuple[str, int]]) -> list[dict[str, int]]:
    """Server stamps cut into one dict per request (each starts at `intercept`); within a
    request only a label's first stamp counts."""
    out: list[dict[str, int]] = []
    for label, t in stamps:
        if label == "intercept":
            out.append({})
        if out and label not in out[-1]:
            out[-1][label] = t
    return out


def server_command(args: argparse.Namespace, out: Path, model_dir: Path | None) -> list[str]:
    if args.floor:
        prefill_ms, step_ms = (args.stub_ms or "3,1.9").split(",")
        floor = str(ROOT / "bench" / "wire_floor.py")
        cmd = [sys.executable, floor, str(out), str(args.port), prefill_ms, step_ms]
        return [*cmd, "--server", args.floor_server]
    cmd = [sys.executable, str(ROOT / "bench" / "wire_probes.py"), str(out)]
    cmd += ["--port", str(args.port), "--device", args.device, "--log-level", "WARNING"]
    if model_dir is not None:
        cmd += ["--model", str(model_dir)]
    return cmd + args.serve_arg


@dataclass
class Gaps:
    """Inter-token gaps (ms): as the client saw them, as the engine measured them."""

    client: list[float]
    engine: list[float]


PROMPT = "def quicksort(items):\n    " * 20  # bench/wire.py's prompt


def record(
    rows: list[dict[str, int]], gaps: Gaps, sent: int, called: int, stream: StreamState
) -> None:
    """One finished completion's client stamps and inter-token gaps (pooled, as
    bench/wire.py's inter-token medians are)."""
    times = stream.token_times
    first = round(times[0] * 1e9)
    rows.append({"client_send": sent, "client_called": called, "client_first": first})
    gaps.client += [(b - a) * 1e3 for a, b in itertools.pairwise(times)]
    gaps.engine += stream.timings.inter_token_ms


def run_client(
    address: str, reps: int, new: int, path: str = "complete"
) -> tuple[list[dict[str, int]], Gaps]:
    """Client-side stamps of each completion through the SDK's Client, and its gaps:
    a Complete call each, or (path "session") a message each on one open Session."""
    from nib.sdk import Client

    rows: list[dict[str, int]] = []
    gaps = Gaps([], [])
    with Client(address) as client:
        client.wait_ready(600)
        with client.session() if path == "session" else contextlib.nullcontext(client) as via:
            for _ in range(WARM_UP):
                via.complete(PROMPT, max_tokens=new).result()
            for _ in range(reps):
                sent = time.perf_counter_ns()
                stream = via.complete(PROMPT, max_tokens=new)
                called = time.perf_counter_ns()
                stream.result()
                record(rows, gaps, sent, called, stream)
    return rows, gaps


async def run_aio_client(address: str, reps: int, new: int) -> tuple[list[dict[str, int]], Gaps]:
    """As run_client, through the SDK's AsyncClient. Its complete() only creates the
    call: grpc.aio sends the request once the loop runs, inside `called -> first`."""
    from nib.sdk import AsyncClient

    rows: list[dict[str, int]] = []
    gaps = Gaps([], [])
    async with AsyncClient(address) as client:
        await client.wait_ready(600)
        for _ in range(WARM_UP):
            await client.complete(PROMPT, max_tokens=new).result()
        for _ in range(reps):
            sent = time.perf_counter_ns()
            stream = client.complete(PROMPT, max_tokens=new)
            called = time.perf_counter_ns()
            await stream.result()
            record(rows, gaps, sent, called, stream)
    return rows, gaps


def measure(
    args: argparse.Namespace, model_dir: Path | None, tmp: Path
) -> tuple[list[dict[str, int]], Gaps, int | None]:
    """One stamped row per timed completion, the inter-token gaps, and the GIL switch
    interval (µs) nib's server ran with (None for the floor)."""
    out = tmp / "stamps.json"
    env = {**os.environ, "NIB_TRACE_STUB": "" if args.floor else args.stub_ms or ""}
    env["NIB_TRACE_SWITCH_US"] = "" if args.switch_us is None else str(args.switch_us)
    proc = subprocess.Popen(server_command(args, out, model_dir), env=env)
    try:
        address = f"127.0.0.1:{args.port}"
        if args.client == "aio":
            client, gaps = asyncio.run(run_aio_client(address, args.reps, args.new))
        else:
            client, gaps = run_client(address, args.reps, args.new, args.path)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    stamps = json.loads(out.read_text())
    server = split(stamps)[WARM_UP:]
    rows = [{**c, **s} for c, s in zip(client, server, strict=True)]
    # nib's server (wire_probes) stamps its switch interval first; the floor does not.
    first = stamps[0] if stamps else ("", None)
    return rows, gaps, first[1] if first[0] == "switch_interval_us" else None


def median_ms(rows: list[dict[str, int]], a: str, b: str) -> float | None:
    gaps = [(r[b] - r[a]) / 1e6 for r in rows if a in r and b in r]
    return statistics.median(gaps) if gaps else None


def report(rows: list[dict[str, int]], inter_token: Gaps) -> dict[str, float | None]:
    present = [label for label in ORDER if any(label in r for r in rows)]
    print(f"{len(rows)} requests; median ms per hop:")
    for a, b in itertools.pairwise(present):
        print(f"  {a:>13} -> {b:<13} {median_ms(rows, a, b):7.3f}")
    gaps = [
        ((r["client_first"] - r["client_send"]) - (r["first_token"] - r["submit"])) / 1e6
        for r in rows
    ]
    summary = {
        "client_ttft_ms": median_ms(rows, "client_send", "client_first"),
        "engine_ttft_ms": median_ms(rows, "submit", "first_token"),
        "before_engine_ms": median_ms(rows, "client_send", "submit"),
        "after_engine_ms": median_ms(rows, "first_token", "client_first"),
        "gap_ms": statistics.median(gaps),
        # NaN where no completion had two tokens (a model that ends at once).
        "client_inter_token_ms": statistics.median(inter_token.client or [math.nan]),
        "engine_inter_token_ms": statistics.median(inter_token.engine or [math.nan]),
    }
    for key, value in summary.items():
        print(f"  {key:>29} {value:7.3f}")
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--shape", default="nib-tiny-code", help="as bench/wire.py (GPU shapes)")
    p.add_argument("--model", type=Path, help="serve this model folder instead of --shape")
    p.add_argument("--device", default="cuda")
    p.add_argument("--stub-ms", help="PREFILL,STEP: the model's forward only waits this long")
    p.add_argument("--floor", action="store_true", help="serve from bench/wire_floor.py")
    p.add_argument(
        "--floor-server", choices=("aio", "sync"), default="aio", help="gRPC's server (--floor)"
    )
    p.add_argument("--client", choices=("sync", "aio"), default="sync", help="the SDK's client")
    p.add_argument(
        "--path",
        choices=("complete", "session"),
        default="complete",
        help="a Complete call per completion, or a message each on one open Session",
    )
    p.add_argument("--reps", type=int, default=60)
    p.add_argument("--new", type=int, default=128)
    p.add_argument("--port", type=int, default=50073)
    p.add_argument("--serve-arg", action="append", default=[], help="extra `nib serve` argument")
    p.add_argument("--json", type=Path, help="also write the stamps and the summary here")
    p.add_argument(
        "--spin", type=int, default=0, help="keep CPUs awake with N spinners (bench/spin.py)"
    )
    p.add_argument(
        "--switch-us",
        type=float,
        help="nib's server's GIL switch interval, µs (sys.setswitchinterval; Python's 5000)",
    )
    args = p.parse_args(argv)
    if args.switch_us is not None and (args.floor or not args.switch_us > 0):
        p.error("--switch-us must be above 0, and sets nib's server's: not with --floor")
    if args.spin < 0:
        p.error("--spin must be at least 0")
    if args.floor_server != "aio" and not args.floor:
        p.error("--floor-server chooses the floor's server: it needs --floor")
    if args.path == "session" and (args.floor or args.client != "sync"):
        p.error("--path session runs nib's server and the SDK's sync Client only")
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model
        if model_dir is None and args.shape != "nib-tiny-code" and not args.floor:
            sys.path.insert(0, str(ROOT / "bench"))
            from typing_trace import random_model_dir

            model_dir = random_model_dir(args.shape, Path(tmp) / "model")
        sys.path.insert(0, str(ROOT / "bench"))
        from spin import spinners

        with spinners(args.spin):
            rows, inter_token, switch_us = measure(args, model_dir, Path(tmp))
    summary = report(rows, inter_token)
    if args.json is not None:
        flavour = {
            "floor_server": args.floor_server if args.floor else None,
            "client": args.client,
            "path": args.path,
            "spin": args.spin,
            # What the server ran with (its first stamp); None for the floor.
            "switch_interval_us": switch_us,
        }
        args.json.write_text(
            json.dumps({"argv": sys.argv, "summary": summary, "rows": rows, **flavour})
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
