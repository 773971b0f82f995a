"""Through the wire: what a client on loopback sees, against what the engine measures.

    python3 bench/wire.py --shape qwen2.5-coder-1.5b            # GPU host
    python3 bench/wire.py --shape nib-tiny-code --device cpu     # the shipped model
    python3 bench/wire.py --model DIR --device cpu               # any model folder

Starts `nib serve` on 127.0.0.1 with a model of the given shape (random-init
weights for the GPU shapes), then from this process (another process than the
server) streams greedy completions through the SDK: client-observed median
inter-token time and time to first token, against the server's own timings
for the same requests (Done.timings), once on `Complete` (a call per completion)
and once on one open `Session` (a message per completion on a stream opened
once, as the LSP bridge and editor plugins keep it; keys prefixed `session_`).
Then cancels completions on an SDK
Session after k tokens and counts how many tokens, and how many engine steps,
the engine still made after the cancel() call (on the server's clock, from
Done.timings.arrival_unix_ms: client and server share the host's clock), and how
many the client had not seen when it cancelled. Checks the figures against issue 6 (client median
inter-token time at most the engine's + 0.15 ms, time to first token within
1 ms of the engine's, a cancel stops generation within 2 steps), for each path;
--strict makes a miss on either exit 2. Writes <out>/<date>-wire.json (rows merged by shape).

Every figure is per token, from the SDK's `token_times` (when each token's
delta reached the client; the tokens of a delta the server joined share that
delta's gap evenly, see spread_gaps), never per text chunk: a token may bring no text
(token healing re-generating the prompt's last characters, a byte inside a
UTF-8 character, a possible stop string), and a random-weight model can
produce 128 tokens none of which decodes to text. When no gap could be
measured the bench says why and exits 1.
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nib.sdk import SessionStream

ROOT = Path(__file__).resolve().parent.parent

# Issue 6's targets.
MAX_EXTRA_INTER_TOKEN_MS = 0.15
MAX_TTFT_DIFF_MS = 1.0
MAX_CANCEL_STEPS = 2


class BenchFailure(Exception):
    """The bench could not measure what it is for (not a missed target)."""


def start_server(
    model_dir: Path | None, device: str, port: int, extra: list[str]
) -> subprocess.Popen[bytes]:
    from nib.sdk import Client, NibError

    cmd = [
        sys.executable,
        "-m",
        "nib.sdk.cli",
        "serve",
        "--port",
        str(port),
        "--device",
        device,
        *extra,
    ]
    if model_dir is not None:
        cmd += ["--model", str(model_dir)]
    proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    with Client(f"127.0.0.1:{port}") as client:
        for _ in range(1200):
            if proc.poll() is not None:
                raise BenchFailure(f"the server exited with {proc.returncode} before SERVING")
            try:
                if client.health(timeout=1.0) == "SERVING":
                    return proc
            except NibError:
                pass
            time.sleep(0.5)
    proc.kill()
    proc.wait()
    raise BenchFailure("the server did not become SERVING in 10 minutes")


def stream_stats(
    address: str, prompt: str, new: int, reps: int, via: str = "complete"
) -> dict[str, object]:
    """Greedy completions on `Complete` (a call per completion) or on one open `Session`
    (via="session": a message per completion on a stream opened once, as an editor
    keeps it): per-token gaps and time to first token, as the client saw them (SDK
    token_times) and as the engine measured them (Done.timings)."""
    from nib.sdk import Client

    with Client(address) as client:
        if via == "session":
            with client.session() as session:
                return _stream_stats(session.complete, prompt, new, reps)
        return _stream_stats(client.complete, prompt, new, reps)


def spread_gaps(stamps: list[float]) -> list[float]:
    """Client gaps per token (ms), one for each token after the first delta, with the
    tokens the server joined into one delta (they share its time stamp) sharing that
    delta's gap evenly: a delta of n tokens that came G ms after the one before counts n
    gaps of G / n, where per-token gaps would count one of G and n - 1 of 0 (a client
    that fell behind would look fast). Tokens joined into the first delta have no gap
    the client can time: they came with the first token, and their wait is in the time
    to first token, so they count no gap (not gaps of 0). Equal to the per-token gaps
    when nothing was joined."""
    groups: list[tuple[float, int]] = []  # (stamp, tokens) per delta, in order
    for t in stamps:
        if groups and groups[-1][0] == t:
            groups[-1] = (t, groups[-1][1] + 1)
        else:
            groups.append((t, 1))
    out: list[float] = []
    for (a, _), (b, n) in itertools.pairwise(groups):
        out += [(b - a) * 1e3 / n] * n
    return out


def _stream_stats(complete: Any, prompt: str, new: int, reps: int) -> dict[str, object]:
    client_gaps: list[float] = []
    engine_gaps: list[float] = []
    rep_engine_gaps: list[list[float]] = []
    client_ttft: list[float] = []
    engine_ttft: list[float] = []
    first_text: list[float] = []
    tokens, text_chunks, deltas = [], [], []
    complete(prompt, max_tokens=new).result()  # warm-up
    for _ in range(reps):
        start = time.perf_counter()
        stream = complete(prompt, max_tokens=new)
        text_chunks.append(sum(1 for _text in stream))
        stamps = stream.token_times
        tokens.append(len(stamps))
        deltas.append(stream.token_deltas)
        if len(stamps) != stream.usage.completion_tokens:
            raise BenchFailure(
                f"the client saw {len(stamps)} tokens, the server reports "
                f"{stream.usage.completion_tokens} ({stream.finish_reason})"
            )
        if not stamps:
            continue  # ended at once (end of text): nothing to time
        client_ttft.append((stamps[0] - start) * 1e3)
        engine_ttft.append(stream.timings.ttft_ms)
        if stream.first_delta_s is not None:
            first_text.append(stream.first_delta_s * 1e3)
        client_gaps += spread_gaps(stamps)
        engine_gaps += stream.timings.inter_token_ms
        rep_engine_gaps.append(list(stream.timings.inter_token_ms))
    if not client_gaps or not engine_gaps:
        raise BenchFailure(
            f"no inter-token gap to time: {reps} completions of max_tokens={new} gave "
            f"{tokens} tokens in {deltas} deltas ({text_chunks} text deltas); a model "
            "that ends at once, or a client so slow that every token came in one "
            "delta, cannot be timed"
        )
    return {
        # Per token, a joined delta's gap shared by its tokens (spread_gaps).
        "client_inter_token_ms_median": statistics.median(client_gaps),
        "engine_inter_token_ms_median": statistics.median(engine_gaps),
        "client_ttft_ms_median": statistics.median(client_ttft),
        "engine_ttft_ms_median": statistics.median(engine_ttft),
        # Text can come later than the first token (healing, partial UTF-8): for reference.
        "client_first_text_ms_median": statistics.median(first_text) if first_text else None,
        "tokens_per_completion": tokens,
        "text_deltas_per_completion": text_chunks,
        # Messages with token ids: fewer than the tokens where the server joined tokens
        # that waited behind the stream (they share one client time stamp and, after
        # the first delta, that delta's gap: spread_gaps).
        "deltas_per_completion": deltas,
        "engine_step_boundary_ms": step_boundary_ms(rep_engine_gaps),
    }


def step_boundary_ms(rep_gaps: list[list[float]]) -> float:
    """The engine gap at and above which a token starts a new decode step: half the
    engine's mean gap per token (the median over the completions).

    Speculative decoding hands over the tokens of one verify step back to back
    (microseconds apart), so those gaps sit far below the mean and the step gaps
    at or above it; without drafts every gap is about the mean, and every token
    counts as a step.
    """
    means = [statistics.fmean(g) for g in rep_gaps if g]
    return 0.5 * statistics.median(means) if means else 0.0


def token_clock(arrival_unix_ms: float, ttft_ms: float, engine_gaps: list[float]) -> list[float]:
    """When the engine had each token ready, on the server's Unix clock (ms), from a
    Done's timings: arrival, then the time to the first token, then the gaps."""
    return list(itertools.accumulate(engine_gaps, initial=arrival_unix_ms + ttft_ms))


def made_since(
    times_ms: list[float], engine_gaps: list[float], since_ms: float, boundary_ms: float
) -> tuple[int, int]:
    """(tokens, decode steps) the engine made after since_ms (same clock as times_ms).

    engine_gaps[i] is the gap before token i + 1 (0-based); a token starts a step when
    its gap is at least boundary_ms (every token does when boundary_ms is 0), and the
    first token made after since_ms counts as a step whatever its gap: its step ended
    after since_ms."""
    late = [i for i, t in enumerate(times_ms) if t > since_ms]
    steps = sum(1 for i in late if i == late[0] or engine_gaps[i - 1] >= boundary_ms)
    return len(late), steps


def cancel_at(stream: SessionStream, after: int, at_cancel: list[tuple[int, float, float]]) -> None:
    """On its own thread: cancel `stream` as soon as the SDK has taken `after` tokens in
    (tokens that bring no text never reach the caller's loop), and note in at_cancel how
    many it had and when (perf_counter, and the Unix clock in ms). Does nothing when the
    completion ended first."""
    while not stream.done and len(stream.token_times) < after:
        time.sleep(0.0001)
    at_cancel.append((len(stream.token_times), time.perf_counter(), time.time() * 1e3))
    stream.cancel()


def cancel_overrun(
    address: str, prompt: str, after: int, reps: int, boundary_ms: float
) -> dict[str, object]:
    """Cancel greedy completions on an SDK Session once `after` tokens reached the
    client: how many tokens (and engine steps) the engine made after the cancel() call,
    on the server's clock (client and server share the host's), and how many the client
    had not seen when it cancelled (those also count the ones already made and on their
    way to it)."""
    from nib.sdk import Client

    tokens, steps, unseen, cancel_ms, last_ms, missed = [], [], [], [], [], []
    with Client(address) as client, client.session() as session:
        for _ in range(reps):
            stream = session.complete(prompt, max_tokens=max(1000, 4 * after))
            at_cancel: list[tuple[int, float, float]] = []
            watcher = threading.Thread(
                target=cancel_at, args=(stream, after, at_cancel), daemon=True
            )
            watcher.start()
            for _text in stream:
                pass
            watcher.join(60)
            if not stream.cancelled:
                missed.append(f"{stream.finish_reason} after {len(stream.token_ids)} tokens")
                continue
            if not stream.server_done.wait(60):
                raise BenchFailure("the server never confirmed a cancel")
            ((received, sent, sent_unix_ms),) = at_cancel
            cancel_ms.append((time.perf_counter() - sent) * 1e3)
            t = stream.timings
            if not t.arrival_unix_ms:
                raise BenchFailure("the server's Done carries no timings.arrival_unix_ms")
            gaps = list(t.inter_token_ms)
            times = token_clock(t.arrival_unix_ms, t.ttft_ms, gaps)
            made, made_steps = made_since(times, gaps, sent_unix_ms, boundary_ms)
            tokens.append(made)
            steps.append(made_steps)
            unseen.append(stream.usage.completion_tokens - received)
            last_ms.append(times[-1] - sent_unix_ms)
    if not tokens:
        raise BenchFailure(
            f"no completion ran to {after} tokens to be cancelled: {missed}; lower --cancel-after"
        )
    return {
        "cancel_after_tokens": after,
        "cancel_overrun_tokens": tokens,
        "cancel_overrun_tokens_max": max(tokens),
        "cancel_overrun_steps": steps,
        "cancel_overrun_steps_max": max(steps),
        # Tokens the client had not seen at cancel(): the overrun plus those in flight.
        "cancel_unseen_tokens": unseen,
        "cancel_unseen_tokens_max": max(unseen),
        # From cancel() to the engine's last token (server clock; < 0: none after it).
        "cancel_to_last_token_ms": [round(x, 3) for x in last_ms],
        # From cancel() until the server's done reached the client (a round trip).
        "cancel_to_done_ms_median": statistics.median(cancel_ms),
        "cancel_missed": missed,
    }


def issue_6(row: dict[str, object], prefix: str = "") -> list[str]:
    """The targets of issue 6 that this row misses, in words (empty: all met); prefix
    "session_": the streaming figures of the Session path (the cancel check is shared)."""

    def f(key: str) -> float:
        value = row[prefix + key] if prefix + key in row else row[key]
        assert isinstance(value, (int, float)), key
        return float(value)

    misses = []
    itl, engine_itl = f("client_inter_token_ms_median"), f("engine_inter_token_ms_median")
    if itl > engine_itl + MAX_EXTRA_INTER_TOKEN_MS:
        misses.append(
            f"client median inter-token {itl:.3f} ms > engine {engine_itl:.3f} + "
            f"{MAX_EXTRA_INTER_TOKEN_MS} ms"
        )
    ttft, engine_ttft = f("client_ttft_ms_median"), f("engine_ttft_ms_median")
    if abs(ttft - engine_ttft) > MAX_TTFT_DIFF_MS:
        misses.append(
            f"client time to first token {ttft:.3f} ms not within {MAX_TTFT_DIFF_MS} ms of "
            f"the engine's {engine_ttft:.3f} ms"
        )
    if f("cancel_overrun_steps_max") > MAX_CANCEL_STEPS:
        misses.append(
            f"a cancel let the engine run {row['cancel_overrun_steps_max']} more steps "
            f"(> {MAX_CANCEL_STEPS})"
        )
    return misses


def _versions(device: str) -> dict[str, str]:
    """The GPU's name and the torch version of this host, for the result file."""
    import torch

    name = torch.cuda.get_device_name() if device == "cuda" and torch.cuda.is_available() else "cpu"
    return {"gpu": name, "torch": torch.__version__}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shape", default="nib-tiny-code")
    parser.add_argument("--model", type=Path, help="serve this model folder instead of --shape")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--cancel-after", type=int, default=8)
    parser.add_argument("--cancel-reps", type=int, default=10)
    parser.add_argument("--port", type=int, default=50071)
    parser.add_argument(
        "--serve-arg", action="append", default=[], help="extra `nib serve` argument"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--strict", action="store_true", help="exit 2 when issue 6 is missed")
    parser.add_argument(
        "--spin", type=int, default=0, help="keep CPUs awake with N spinners (bench/spin.py)"
    )
    args = parser.parse_args(argv)
    random_shape = args.model is None and args.shape != "nib-tiny-code"
    if random_shape and args.device != "cuda":
        parser.error("random-weight shapes are built on the GPU; on the CPU give --model DIR")
    if min(args.new, args.reps, args.cancel_after, args.cancel_reps) < 1 or args.new < 2:
        parser.error("--new must be at least 2, --reps/--cancel-after/--cancel-reps at least 1")
    if args.spin < 0:
        parser.error("--spin must be at least 0")
    shape = args.shape if args.model is None else args.model.resolve().name
    sys.path.insert(0, str(ROOT / "bench"))
    from spin import spinners

    try:
        with spinners(args.spin):
            row = measure(args, shape, random_shape)
    except BenchFailure as exc:
        print(f"bench/wire.py: FAILED ({shape}, {args.device}): {exc}", file=sys.stderr)
        return 1
    misses = issue_6(row)
    session_misses = issue_6(row, "session_")
    row["issue_6_met"] = not misses
    row["issue_6_misses"] = misses
    row["issue_6_session_met"] = not session_misses
    row["issue_6_session_misses"] = session_misses
    print(json.dumps(row), flush=True)
    for path, prefix, missed in (("Complete", "", misses), ("Session", "session_", session_misses)):
        print(
            f"issue 6 on {path}: "
            + ("met" if not missed else "MISSED: " + "; ".join(missed))
            + f" (client/engine median inter-token {row[prefix + 'client_inter_token_ms_median']:.3f}/"
            f"{row[prefix + 'engine_inter_token_ms_median']:.3f} ms, ttft "
            f"{row[prefix + 'client_ttft_ms_median']:.2f}/{row[prefix + 'engine_ttft_ms_median']:.2f}"
            f" ms, cancel overrun max {row['cancel_overrun_steps_max']} steps / "
            f"{row['cancel_overrun_tokens_max']} tokens)",
            flush=True,
        )
    today = dt.date.today().isoformat()
    path = args.out / f"{today}-wire.json"
    args.out.mkdir(parents=True, exist_ok=True)
    result = json.loads(path.read_text()) if path.exists() else {"date": today, "rows": []}
    result["rows"] = [
        r
        for r in result["rows"]
        if (r["shape"], r.get("device"), r.get("serve_args"), r.get("spin", 0))
        != (shape, args.device, args.serve_arg, args.spin)
    ]
    result["rows"].append(row)
    result.update(_versions(args.device))
    result.setdefault("commands", []).append(
        "python3 bench/wire.py " + " ".join(argv if argv is not None else sys.argv[1:])
    )
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")
    return 2 if (misses or session_misses) and args.strict else 0


def measure(args: argparse.Namespace, shape: str, random_shape: bool) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model
        if random_shape:
            sys.path.insert(0, str(ROOT / "bench"))
            from typing_trace import random_model_dir

            model_dir = random_model_dir(args.shape, Path(tmp))
        proc = start_server(model_dir, args.device, args.port, args.serve_arg)
        try:
            address = f"127.0.0.1:{args.port}"
            prompt = "def quicksort(items):\n    " * 20
            row: dict[str, object] = {
                "shape": shape,
                "device": args.device,
                "serve_args": args.serve_arg,
                "spin": args.spin,
                "new_tokens": args.new,
            }
            row.update(stream_stats(address, prompt, args.new, args.reps))
            session = stream_stats(address, prompt, args.new, args.reps, via="session")
            row.update({f"session_{k}": v for k, v in session.items()})
            boundary = row["engine_step_boundary_ms"]
            assert isinstance(boundary, float)
            row.update(
                cancel_overrun(address, prompt, args.cancel_after, args.cancel_reps, boundary)
            )
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return row


if __name__ == "__main__":
    sys.exit(main())
