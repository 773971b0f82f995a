"""The least a Complete call can cost on this machine: gRPC's asyncio server, an engine
thread handing tokens to the event loop, the SDK's client, and nothing of nib's in between.

    python3 bench/wire_floor.py OUT.json PORT PREFILL_MS STEP_MS

Serves CompletionService.Complete on 127.0.0.1:PORT. Each call hands a job to one
long-lived thread, which waits PREFILL_MS (the GIL released, as the engine waits for
the GPU), then passes one token to the event loop by call_soon_threadsafe every STEP_MS,
max_tokens of them; the handler yields each as a Delta. No validation, tokenising,
interceptors or bookkeeping: what bench/wire_trace.py measures here is the floor under
nib's own figure. Stamps (wire_probes.py's labels) go to OUT.json on SIGTERM.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import queue
import signal
import sys
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from nib.v1 import completion_pb2 as pb
from nib.v1 import completion_pb2_grpc as pb_grpc

# A token's id, or at the end the engine's inter-token gaps (ms) for the Done.
Event = int | list[float]
Job = tuple[asyncio.AbstractEventLoop, "asyncio.Queue[Event]", int]
STAMPS: list[tuple[str, int]] = []


def stamp(label: str) -> None:
    STAMPS.append((label, time.perf_counter_ns()))


def engine(jobs: queue.Queue[Job], prefill_s: float, step_s: float) -> None:
    while True:
        loop, events, count = jobs.get()
        time.sleep(prefill_s)
        times = []
        for i in range(count):
            times.append(time.perf_counter())
            if i == 0:
                stamp("first_token")
            loop.call_soon_threadsafe(events.put_nowait, i)
            time.sleep(step_s)
        gaps = [(b - a) * 1e3 for a, b in itertools.pairwise(times)]
        loop.call_soon_threadsafe(events.put_nowait, gaps)


class FloorServicer(pb_grpc.CompletionServiceServicer):  # type: ignore[misc]
    def __init__(self, jobs: queue.Queue[Job]) -> None:
        self.jobs = jobs

    async def Complete(
        self, request: pb.CompleteRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.CompleteResponse]:
        stamp("intercept")
        events: asyncio.Queue[Event] = asyncio.Queue()
        stamp("submit")
        self.jobs.put((asyncio.get_running_loop(), events, request.max_tokens or 16))
        rid, first = request.request_id, True
        while isinstance(event := await events.get(), int):
            if first:
                stamp("yielded")
                first = False
            yield pb.CompleteResponse(request_id=rid, delta=pb.Delta(text="x", token_ids=[event]))
        done = pb.Done(
            finish_reason=pb.FINISH_REASON_LENGTH, timings=pb.Timings(inter_token_ms=event)
        )
        yield pb.CompleteResponse(request_id=rid, done=done)


async def serve(port: int, prefill_s: float, step_s: float) -> None:
    jobs: queue.Queue[Job] = queue.Queue()
    threading.Thread(target=engine, args=(jobs, prefill_s, step_s), daemon=True).start()
    server = grpc.aio.server()
    pb_grpc.add_CompletionServiceServicer_to_server(FloorServicer(jobs), server)
    checks = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(checks, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await checks.set("", health_pb2.HealthCheckResponse.SERVING)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await server.stop(0)


def main() -> int:
    out, port, prefill_ms, step_ms = Path(sys.argv[1]), *sys.argv[2:5]
    asyncio.run(serve(int(port), float(prefill_ms) / 1e3, float(step_ms) / 1e3))
    out.write_text(json.dumps(STAMPS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
