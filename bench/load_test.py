"""A bounded load test on loopback: many concurrent sessions mixing completions,
cancels, supersessions, disconnects and deadlines; then it checks that every stream
ended with a final message or a status, that no request was lost (client and
server counts agree), and that the server's memory and threads came back.

    python bench/load_test.py                           # starts its own server
    python bench/load_test.py --sessions 200 --rounds 3 --json out.json
    python bench/load_test.py --address HOST:PORT --metrics-url http://HOST:PORT/metrics

Without --address it serves a random-init test model (or --model DIR) on
127.0.0.1 and reads the server's RSS and thread count from /proc. Exit status
0 when every check holds, 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from server_process import ServerProcess, start_server

from nib.v1 import completion_pb2 as pb
from nib.v1 import completion_pb2_grpc as pb_grpc

SCENARIOS = ("complete", "cancel", "supersede", "disconnect", "oneshot", "deadline")
# Tries of the first request of a cancel, supersede or disconnect session while the
# server answers RESOURCE_EXHAUSTED (backing off 20 ms, doubling, at most 1 s a wait).
RETRIES = 40
FINISH = {v: k.removeprefix("FINISH_REASON_").lower() for k, v in pb.FinishReason.items()}


@dataclass
class Tally:
    """Client-side accounting: one terminal outcome per request id, or a violation."""

    outcomes: dict[str, str] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    streams: Counter[str] = field(default_factory=Counter)
    ttft_ms: list[float] = field(default_factory=list)
    tokens: int = 0
    # Requests that ended on the client's side (its own cancel, its deadline) before any
    # answer came: the server may never have read them, so it may not count them.
    unconfirmed: list[str] = field(default_factory=list)

    def end(self, rid: str, outcome: str) -> None:
        if rid in self.outcomes:
            self.violations.append(f"{rid}: second outcome {outcome} after {self.outcomes[rid]}")
        self.outcomes[rid] = outcome

    def done(self, rid: str, done: pb.Done) -> None:
        if done.finish_reason == pb.FINISH_REASON_ERROR:
            self.end(rid, f"error:{grpc.StatusCode(_code(done.error_code)).name}")
            return
        self.end(rid, FINISH[done.finish_reason])
        self.tokens += done.usage.completion_tokens
        if done.usage.completion_tokens:
            self.ttft_ms.append(done.timings.ttft_ms)


def _code(number: int) -> tuple[int, str]:
    return next(c.value for c in grpc.StatusCode if c.value[0] == number)


class SessionRun:
    """One Session stream driven by a scenario."""

    def __init__(self, stub: pb_grpc.CompletionServiceStub, tally: Tally, name: str) -> None:
        self.call = stub.Session()
        self.tally = tally
        self.name = name
        self.deltas: Counter[str] = Counter()
        self.open: set[str] = set()
        self.answered: set[str] = set()
        self.progress = asyncio.Event()

    async def start(self, rid: str, max_tokens: int) -> None:
        self.open.add(rid)
        req = pb.CompleteRequest(prompt=f"{rid} ", max_tokens=max_tokens, request_id=rid)
        await self.call.write(pb.SessionRequest(start=req))

    async def read(self) -> None:
        async for r in self.call:
            if r.request_id not in self.open:
                self.tally.violations.append(f"{self.name}: message for {r.request_id!r}")
                continue
            self.answered.add(r.request_id)
            if r.HasField("delta"):
                self.deltas[r.request_id] += 1
            else:
                self.open.discard(r.request_id)
                self.tally.done(r.request_id, r.done)
            self.progress.set()

    async def start_admitted(
        self, name: str, max_tokens: int, deltas: int, max_wait: float, rng: random.Random
    ) -> str:
        """Start a request, then wait as wait_deltas does; while the server turns it away
        with RESOURCE_EXHAUSTED, back off and start it again under a new id, as a polite
        client does. The scenario's cancel, supersession or disconnect then meets a request
        the server took (queued or running), whatever the machine's speed; the rejections
        stay in the tally. Returns the id that was not turned away (or the last try's)."""
        rid = f"{name}-a"
        for attempt in range(RETRIES):
            await self.start(rid, max_tokens)
            # A rejection comes at once; a queued request hears nothing, so wait a little.
            await self.wait_deltas(rid, deltas, max(max_wait, 0.05))
            if self.tally.outcomes.get(rid) != "error:RESOURCE_EXHAUSTED":
                return rid
            self.tally.streams["retried:RESOURCE_EXHAUSTED"] += 1
            await asyncio.sleep(min(1.0, 0.02 * 2**attempt) * rng.uniform(0.5, 1.5))
            rid = f"{name}-a{attempt + 1}"
        return rid

    async def wait_deltas(self, rid: str, n: int, max_wait: float) -> None:
        """Until rid has n deltas, has ended, or max_wait passed."""
        deadline = time.monotonic() + max_wait
        while self.deltas[rid] < n and rid in self.open and time.monotonic() < deadline:
            self.progress.clear()
            try:
                async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                    await self.progress.wait()
            except TimeoutError:
                return


async def run_session(
    stub: pb_grpc.CompletionServiceStub, tally: Tally, name: str, rng: random.Random
) -> None:
    scenario = rng.choice(SCENARIOS)
    tally.streams[f"scenario:{scenario}"] += 1
    if scenario in ("oneshot", "deadline"):
        rid = f"{name}-c"
        timeout = rng.uniform(0.05, 0.5) if scenario == "deadline" else None
        max_tokens = 500 if scenario == "deadline" else rng.randint(4, 24)
        call = stub.Complete(
            pb.CompleteRequest(prompt="x", max_tokens=max_tokens, request_id=rid), timeout=timeout
        )
        answered = False
        try:
            async for r in call:
                answered = True
                if r.HasField("done"):
                    tally.done(rid, r.done)
            if rid not in tally.outcomes:
                tally.violations.append(f"{rid}: stream ended OK without a done")
            tally.streams["ended:OK"] += 1
        except grpc.aio.AioRpcError as exc:
            tally.end(rid, f"status:{exc.code().name}")
            tally.streams[f"ended:{exc.code().name}"] += 1
            if not answered and exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                tally.unconfirmed.append(rid)
        return

    run = SessionRun(stub, tally, name)
    reader = asyncio.create_task(run.read())
    try:
        if scenario == "complete":
            first = f"{name}-a"
            await run.start(first, rng.randint(4, 24))
            await run.wait_deltas(first, rng.randint(1, 4), rng.uniform(0.0, 0.5))
        else:  # cancel, supersede, disconnect: a long request the server took
            first = await run.start_admitted(
                name, rng.randint(100, 300), rng.randint(1, 4), rng.uniform(0.0, 0.5), rng
            )
        if scenario == "cancel":
            await run.call.write(pb.SessionRequest(cancel=pb.Cancel(request_id=first)))
        elif scenario == "supersede":
            await run.start(f"{name}-b", rng.randint(4, 24))
        elif scenario == "disconnect":
            run.call.cancel()  # the client goes away mid-stream
        if scenario != "disconnect":
            await run.call.done_writing()
        await reader
        tally.streams["ended:OK"] += 1
        for rid in run.open:
            tally.violations.append(f"{rid}: session ended OK without its done")
    except grpc.aio.AioRpcError as exc:
        tally.streams[f"ended:{exc.code().name}"] += 1
        for rid in run.open:
            tally.end(rid, f"status:{exc.code().name}")
    except asyncio.CancelledError:
        if scenario != "disconnect":
            raise
        tally.streams["ended:CANCELLED"] += 1
        for rid in run.open:
            tally.end(rid, "status:CANCELLED")
            if rid not in run.answered:
                tally.unconfirmed.append(rid)
    finally:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)


async def run_round(
    address: str, sessions: int, seed: int, stream_timeout: float, tally: Tally
) -> float:
    channels = [grpc.aio.insecure_channel(address) for _ in range(max(1, sessions // 50))]
    stubs = [pb_grpc.CompletionServiceStub(c) for c in channels]

    async def bounded(i: int) -> None:
        rng = random.Random(seed * 1_000_003 + i)
        try:
            async with asyncio.timeout(stream_timeout):
                await run_session(stubs[i % len(stubs)], tally, f"r{seed}s{i}", rng)
        except TimeoutError:
            tally.violations.append(f"r{seed}s{i}: stream did not end within {stream_timeout}s")

    started = time.perf_counter()
    await asyncio.gather(*(bounded(i) for i in range(sessions)))
    elapsed = time.perf_counter() - started
    for c in channels:
        await c.close()
    return elapsed


def scrape(url: str) -> dict[str, float]:
    """{sample name with labels: value}; only the nib_ series the checks use."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith("nib_"):
                labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
                out[f"{s.name}{{{labels}}}"] = s.value
    return out


def total(samples: dict[str, float], prefix: str) -> float:
    return sum(v for k, v in samples.items() if k.startswith(prefix + "{"))


async def settle(url: str, within_s: float = 60) -> dict[str, float]:
    """Metrics once nothing is in flight, queued or open."""
    deadline = time.monotonic() + within_s
    while True:
        m = await asyncio.to_thread(scrape, url)
        idle = ("nib_inflight_requests{}", "nib_queue_depth{}", "nib_open_sessions{}")
        if all(m.get(k, 0) == 0 for k in idle) or time.monotonic() > deadline:
            return m
        await asyncio.sleep(0.2)


async def wait_serving(address: str, within_s: float = 180) -> None:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            try:
                r = await stub.Check(health_pb2.HealthCheckRequest(), timeout=1)
                if r.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.aio.AioRpcError:
                pass
            await asyncio.sleep(0.2)
    raise RuntimeError(f"{address} did not become SERVING")


async def main_async(args: argparse.Namespace, server: ServerProcess | None) -> dict[str, object]:
    address = args.address or (server.address if server else "")
    metrics_url = args.metrics_url or (server.metrics_url if server else "")
    await wait_serving(address)
    machine = {
        "cpus": os.cpu_count(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "grpcio": grpc.__version__,
        "python": sys.version.split()[0],
    }
    before = await settle(metrics_url)
    at_start = server.proc_stats() if server else {}
    rounds: list[dict[str, object]] = []
    tallies: list[Tally] = []
    for n in range(args.rounds):
        tally = Tally()
        elapsed = await run_round(address, args.sessions, args.seed + n, args.stream_timeout, tally)
        m = await settle(metrics_url)
        await asyncio.sleep(0.5)  # let the thread that served the scrape finish
        ttft = sorted(tally.ttft_ms)
        rounds.append(
            {
                "round": n + 1,
                "seconds": round(elapsed, 2),
                "requests": len(tally.outcomes),
                "tokens": tally.tokens,
                "ttft_ms_p50": round(statistics.median(ttft), 1) if ttft else None,
                "ttft_ms_max": round(ttft[-1], 1) if ttft else None,
                "outcomes": dict(Counter(tally.outcomes.values()).most_common()),
                "streams": dict(tally.streams.most_common()),
                **(server.proc_stats() if server else {}),
                "inflight": m.get("nib_inflight_requests{}"),
                "queue_depth": m.get("nib_queue_depth{}"),
                "open_sessions": m.get("nib_open_sessions{}"),
            }
        )
        tallies.append(tally)
        print(json.dumps(rounds[-1]), file=sys.stderr, flush=True)
    after = await settle(metrics_url)
    sent = sum(len(t.outcomes) for t in tallies)
    unconfirmed = sum(len(t.unconfirmed) for t in tallies)
    violations = [v for t in tallies for v in t.violations]
    server_requests = total(after, "nib_requests_total") - total(before, "nib_requests_total")
    checks = {
        "every stream ended with a final message or a status; one outcome per request": not violations,
        "the server counted every request the client sent (less those the client gave up "
        "on before any answer, which the server may not have read)": (
            sent - unconfirmed <= server_requests <= sent
        ),
        "nothing in flight, queued or open after each round": all(
            r["inflight"] == 0 and r["queue_depth"] == 0 and r["open_sessions"] == 0 for r in rounds
        ),
    }
    if server and len(rounds) > 1:
        base, last = rounds[0], rounds[-1]
        growth = float(last["rss_mb"]) - float(base["rss_mb"])  # type: ignore[arg-type]
        checks[f"RSS grew at most {args.max_rss_growth_mb} MB after the first round"] = (
            growth <= args.max_rss_growth_mb
        )
        checks["threads came back to the first round's count"] = (
            int(last["threads"]) <= int(base["threads"]) + args.thread_slack  # type: ignore[call-overload]
        )
    return {
        "date": time.strftime("%Y-%m-%d"),
        "machine": machine,
        "server": "started by this script (random-init test model)"
        if server and not args.model
        else str(args.model or args.address),
        "max_queue": args.max_queue if server else None,
        "sessions": args.sessions,
        "server_at_start": at_start,
        "rounds": rounds,
        "requests": sent,
        "server_requests": server_requests,
        "unconfirmed": unconfirmed,
        "unconfirmed_ids": [rid for t in tallies for rid in t.unconfirmed],
        "violations": violations[:20],
        "checks": checks,
        "ok": all(checks.values()),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--sessions", type=int, default=200, help="concurrent sessions per round")
    p.add_argument("--rounds", type=int, default=3, help="rounds (the first is the baseline)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--address", help="use a running server instead of starting one")
    p.add_argument("--metrics-url", help="its metrics endpoint (with --address)")
    p.add_argument("--model", type=Path, help="model folder for the server it starts")
    p.add_argument("--max-queue", type=int, default=256, help="--max-queue of the server it starts")
    p.add_argument(
        "--stream-timeout", type=float, default=300, help="seconds before a stream counts as hung"
    )
    p.add_argument("--max-rss-growth-mb", type=float, default=64.0)
    p.add_argument("--thread-slack", type=int, default=0)
    p.add_argument("--json", type=Path, help="write the report here")
    p.add_argument("--server-log", type=Path, help="keep the log of the server it starts here")
    args = p.parse_args(argv)
    if args.address and not args.metrics_url:
        p.error("--address needs --metrics-url (the checks read the server's metrics)")
    with tempfile.TemporaryDirectory() as tmp:
        server = None if args.address else start_server(Path(tmp), args.model, args.max_queue)
        try:
            report = asyncio.run(main_async(args, server))
        finally:
            if server is not None:
                report_exit = server.stop()
                if args.server_log:
                    shutil.copy(server.log, args.server_log)
        if server is not None:
            report["server_exit_code"] = report_exit
            report["checks"]["server exited cleanly on SIGTERM"] = report_exit == 0  # type: ignore[index]
            report["ok"] = all(report["checks"].values())  # type: ignore[attr-defined]
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
