"""The least a Complete call can cost on this machine: gRPC's server, an engine thread
handing tokens to the handler, the SDK's client, and nothing of nib's in between.

    python3 bench/wire_floor.py OUT.json PORT PREFILL_MS STEP_MS [--server aio|sync]

Serves CompletionService.Complete on 127.0.0.1:PORT. Each call hands a job to one
long-lived thread, which waits PREFILL_MS (the GIL released, as the engine waits for
the GPU), then passes one token to the handler every STEP_MS, max_tokens of them; the
handler yields each as a Delta. No validation, tokenising, interceptors or bookkeeping:
what bench/wire_trace.py measures here is the floor under nib's own figure. Stamps
(wire_probes.py's labels) go to OUT.json on SIGTERM.

--server picks gRPC's flavour, the RPC and its messages the same in both:
  aio   grpc.aio's server (nib's): an async generator; the thread hands each token to
        the event loop by call_soon_threadsafe (the default)
  sync  grpc.server on a ThreadPoolExecutor: a generator on a pool thread that blocks
        on a queue the engine thread puts each token into
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import queue
import signal
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent import futures
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from nib.v1 import completion_pb2 as pb
from nib.v1 import completion_pb2_grpc as pb_grpc

# A token's id, or at the end the engine's inter-token gaps (ms) for the Done.
Event = int | list[float]
# How the engine thread hands an event to the handler, and how many tokens to make.
Job = tuple[Callable[[Event], object], int]
STAMPS: list[tuple[str, int]] = []


def stamp(label: str) -> None:
    STAMPS.append((label, time.perf_counter_ns()))


def engine(jobs: queue.Queue[Job], prefill_s: float, step_s: float) -> None:
    while True:
        deliver, count = jobs.get()
        time.sleep(prefill_s)
        times = []
        for i in range(count):
            times.append(time.perf_counter())
            if i == 0:
                stamp("first_token")
            deliver(i)
            time.sleep(step_s)
        deliver([(b - a) * 1e3 for a, b in itertools.pairwise(times)])


def start_engine(prefill_s: float, step_s: float) -> queue.Queue[Job]:
    jobs: queue.Queue[Job] = queue.Queue()
    threading.Thread(target=engine, args=(jobs, prefill_s, step_s), daemon=True).start()
    return jobs


def delta(request_id: str, token: int) -> pb.CompleteResponse:
    return pb.CompleteResponse(request_id=request_id, delta=pb.Delta(text="x", token_ids=[token]))


def done(request_id: str, gaps: list[float]) -> pb.CompleteResponse:
    end = pb.Done(finish_reason=pb.FINISH_REASON_LENGTH, timings=pb.Timings(inter_token_ms=gaps))
    return pb.CompleteResponse(request_id=request_id, done=end)


class FloorServicer(pb_grpc.CompletionServiceServicer):  # type: ignore[misc]
    def __init__(self, jobs: queue.Queue[Job]) -> None:
        self.jobs = jobs

    async def Complete(
        self, request: pb.CompleteRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.CompleteResponse]:
        stamp("intercept")
        events: asyncio.Queue[Event] = asyncio.Queue()
        stamp("submit")
        loop = asyncio.get_running_loop()

        def deliver(event: Event) -> None:
            loop.call_soon_threadsafe(events.put_nowait, event)

        self.jobs.put((deliver, request.max_tokens or 16))
        rid, first = request.request_id, True
        while isinstance(event := await events.get(), int):
            if first:
                stamp("yielded")
                first = False
            yield delta(rid, event)
        yield done(rid, event)


class SyncFloorServicer(pb_grpc.CompletionServiceServicer):  # type: ignore[misc]
    def __init__(self, jobs: queue.Queue[Job]) -> None:
        self.jobs = jobs

    def Complete(
        self, request: pb.CompleteRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.CompleteResponse]:
        stamp("intercept")
        events: queue.SimpleQueue[Event] = queue.SimpleQueue()
        stamp("submit")
        self.jobs.put((events.put, request.max_tokens or 16))
        rid, first = request.request_id, True
        while isinstance(event := events.get(), int):
            if first:
                stamp("yielded")
                first = False
            yield delta(rid, event)
        yield done(rid, event)


async def serve(port: int, prefill_s: float, step_s: float) -> None:
    server = grpc.aio.server()
    pb_grpc.add_CompletionServiceServicer_to_server(
        FloorServicer(start_engine(prefill_s, step_s)), server
    )
    checks = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(checks, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await checks.set("", health_pb2.HealthCheckResponse.SERVING)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await server.stop(0)


def serve_sync(port: int, prefill_s: float, step_s: float) -> grpc.Server:
    """The sync floor, started; the caller stops it. The pool has threads to spare for
    the client's health checks besides the one call in flight."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_CompletionServiceServicer_to_server(
        SyncFloorServicer(start_engine(prefill_s, step_s)), server
    )
    checks = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(checks, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    checks.set("", health_pb2.HealthCheckResponse.SERVING)
    return server


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("port", type=int)
    p.add_argument("prefill_ms", type=float)
    p.add_argument("step_ms", type=float)
    p.add_argument("--server", choices=("aio", "sync"), default="aio")
    args = p.parse_args(argv)
    prefill_s, step_s = args.prefill_ms / 1e3, args.step_ms / 1e3
    if args.server == "aio":
        asyncio.run(serve(args.port, prefill_s, step_s))
    else:
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        server = serve_sync(args.port, prefill_s, step_s)
        stop.wait()
        server.stop(0).wait()
    args.out.write_text(json.dumps(STAMPS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
