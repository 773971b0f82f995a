"""Through the wire: what a client on loopback sees, against what the engine measures.

    python3 bench/wire.py --shape qwen2.5-coder-1.5b            # GPU host
    python3 bench/wire.py --shape nib-tiny-code --device cpu     # the shipped model

Starts `nib serve` on 127.0.0.1 with a model of the given shape (random-init
weights for the GPU shapes), then from this process (another process than the
server) streams greedy completions through the SDK: client-observed median
inter-token time and time to first token, against the server's own timings
for the same requests (Done.timings). Then cancels completions on a Session
after k tokens and counts how many tokens the engine still produced.
Writes bench/results/<date>-wire.json (rows merged by shape).
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

ROOT = Path(__file__).resolve().parent.parent


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
                raise RuntimeError(f"server exited with {proc.returncode}")
            try:
                if client.health(timeout=1.0) == "SERVING":
                    return proc
            except NibError:
                pass
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError("server did not become SERVING")


def stream_stats(address: str, prompt: str, new: int, reps: int) -> dict[str, float]:
    from nib.sdk import Client

    client_gaps, server_gaps, client_ttft, server_ttft = [], [], [], []
    with Client(address) as client:
        list(client.complete(prompt, max_tokens=new))  # warm-up
        for _ in range(reps):
            start = time.perf_counter()
            stamps = []
            stream = client.complete(prompt, max_tokens=new)
            for _text in stream:
                stamps.append(time.perf_counter())
            if not stamps:
                continue  # the model ended at once; nothing to time
            client_ttft.append((stamps[0] - start) * 1e3)
            client_gaps += [(b - a) * 1e3 for a, b in itertools.pairwise(stamps)]
            server_gaps += list(stream.timings.inter_token_ms)
            server_ttft.append(stream.timings.ttft_ms)
    return {
        "client_inter_token_ms_median": statistics.median(client_gaps),
        "engine_inter_token_ms_median": statistics.median(server_gaps),
        "client_ttft_ms_median": statistics.median(client_ttft),
        "engine_ttft_ms_median": statistics.median(server_ttft),
    }


def cancel_overrun(address: str, prompt: str, after: int, reps: int) -> list[int]:
    """Tokens the engine produced after the client sent a cancel, per attempt."""
    import grpc

    from nib.v1 import completion_pb2 as pb
    from nib.v1 import completion_pb2_grpc as pb_grpc

    overruns = []
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.CompletionServiceStub(channel)
        for i in range(reps):
            send_cancel = threading.Event()

            def requests(send_cancel: threading.Event = send_cancel, i: int = i):  # type: ignore[no-untyped-def]
                yield pb.SessionRequest(
                    start=pb.CompleteRequest(prompt=prompt, max_tokens=1000, request_id=f"c{i}")
                )
                send_cancel.wait(60)
                yield pb.SessionRequest(cancel=pb.Cancel(request_id=f"c{i}"))

            received = 0
            at_cancel = None
            for response in stub.Session(requests(), timeout=120):
                if response.HasField("delta"):
                    received += len(response.delta.token_ids)
                    if received >= after and at_cancel is None:
                        at_cancel = received
                        send_cancel.set()
                elif response.HasField("done"):
                    assert response.done.finish_reason == pb.FINISH_REASON_CANCELLED, response.done
                    overruns.append(response.done.usage.completion_tokens - (at_cancel or 0))
                    break
    return overruns


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shape", default="nib-tiny-code")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--port", type=int, default=50071)
    parser.add_argument(
        "--serve-arg", action="append", default=[], help="extra `nib serve` argument"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = None
        if args.shape != "nib-tiny-code":
            sys.path.insert(0, str(ROOT / "bench"))
            from typing_trace import random_model_dir

            model_dir = random_model_dir(args.shape, Path(tmp))
        proc = start_server(model_dir, args.device, args.port, args.serve_arg)
        try:
            address = f"127.0.0.1:{args.port}"
            prompt = "def quicksort(items):\n    " * 20
            row: dict[str, object] = {
                "shape": args.shape,
                "device": args.device,
                "serve_args": args.serve_arg,
            }
            row.update(stream_stats(address, prompt, args.new, args.reps))
            overruns = cancel_overrun(address, prompt, after=8, reps=10)
            row["cancel_overrun_tokens_max"] = max(overruns)
            row["cancel_overrun_tokens"] = overruns
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
    print(json.dumps(row), flush=True)
    today = dt.date.today().isoformat()
    path = args.out / f"{today}-wire.json"
    args.out.mkdir(parents=True, exist_ok=True)
    result = json.loads(path.read_text()) if path.exists() else {"date": today, "rows": []}
    result["rows"] = [
        r
        for r in result["rows"]
        if (r["shape"], r.get("serve_args")) != (args.shape, args.serve_arg)
    ]
    result["rows"].append(row)
    result.setdefault("commands", []).append(
        "python3 bench/wire.py " + " ".join(argv if argv is not None else sys.argv[1:])
    )
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
