"""Faults: a client that vanishes, SIGTERM with requests in flight, an engine that dies,
a request that fails inside the engine."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from nib.sdk import Client
from nib.sdk.health_report import fetch_health_detail
from nib.v1 import completion_pb2 as pb
from nib.v1 import completion_pb2_grpc as pb_grpc

from .conftest import GRPCURL, ServerProcess, json_stream, start_server, stop_server, wait_for

VANISHING_CLIENT = """
import sys, grpc
from nib.v1 import completion_pb2 as pb, completion_pb2_grpc as g
address, rpc, rid = sys.argv[1:]
stub = g.CompletionServiceStub(grpc.insecure_channel(address))
req = pb.CompleteRequest(prompt="a", max_tokens=1000, temperature=1.0, seed=1, request_id=rid)
if rpc == "Complete":
    stream = stub.Complete(req)
else:
    import threading
    forever = threading.Event()
    def messages():
        yield pb.SessionRequest(start=req)
        forever.wait()
    stream = stub.Session(messages())
for response in stream:
    print("delta", flush=True)
"""


@pytest.mark.parametrize("rpc", ["Complete", "Session"])
def test_vanished_client_frees_the_engine_within_a_step(server: ServerProcess, rpc: str) -> None:
    rid = f"vanish-{rpc}"
    client = subprocess.Popen(
        [sys.executable, "-c", VANISHING_CLIENT, server.address, rpc, rid],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert client.stdout is not None
    for _ in range(5):
        assert client.stdout.readline().strip() == "delta"
    client.kill()  # SIGKILL: no goodbye, the kernel closes the connection
    client.wait(10)
    with Client(server.address) as c:
        nxt = c.complete("y", max_tokens=2)
        list(nxt)
    event = server.request_event(rid)
    assert event["code"] == "CANCELLED" and event["cancel_cause"] == "client_gone"
    assert event["finish_reason"] == "cancelled"
    assert 5 <= event["completion_tokens"] < 1000  # type: ignore[operator]
    itl_max = float(event["itl_max_ms"])  # type: ignore[arg-type]
    # From the cancel to the engine's end: at most the rest of the step under way.
    assert float(event["cancel_to_done_ms"]) <= 2 * itl_max + 50  # type: ignore[arg-type]
    # The next request did not queue behind the vanished one's remaining tokens.
    assert nxt.timings.queue_ms < 20 * itl_max + 500, (nxt.timings, itl_max)


def test_sigterm_drains_then_cancels(random_model_dir: Path, tmp_path: Path) -> None:
    server = start_server(
        random_model_dir,
        tmp_path / "server.log",
        "--grace",
        "3",
        env={"NIB_FAULT_INJECTION": "step_delay_s=0.03"},
    )
    channel = grpc.insecure_channel(server.address)
    stub = pb_grpc.CompletionServiceStub(channel)
    short = stub.Complete(pb.CompleteRequest(prompt="s", max_tokens=20), timeout=60)
    assert next(short).HasField("delta")
    long = stub.Complete(pb.CompleteRequest(prompt="l", max_tokens=1000, request_id="long"))
    release = threading.Event()

    def nothing() -> Iterator[pb.SessionRequest]:
        release.wait(30)
        yield from ()

    idle_session = stub.Session(nothing(), timeout=60)  # an open session that sends nothing

    def finish(call: Iterator[object]) -> tuple[str, float, object]:
        try:
            items = list(call)
            return "OK", time.monotonic(), items[-1] if items else None
        except grpc.RpcError as exc:
            return exc.code().name, time.monotonic(), exc.details()

    with ThreadPoolExecutor(4) as pool:
        futures = {
            name: pool.submit(finish, call)
            for name, call in (("short", short), ("long", long), ("idle", idle_session))
        }
        time.sleep(0.3)  # the long one is queued behind the short one
        t0 = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        with Client(server.address) as health:
            wait_for(lambda: health.health() == "NOT_SERVING", 5, "NOT_SERVING")
        with pytest.raises(grpc.RpcError) as info:
            list(stub.Complete(pb.CompleteRequest(prompt="n", max_tokens=2), timeout=10))
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert info.value.details() == "server is shutting down"
        results = {name: f.result(timeout=30) for name, f in futures.items()}
    release.set()
    channel.close()

    code, _, last = results["short"]
    assert code == "OK" and isinstance(last, pb.CompleteResponse)
    assert last.done.finish_reason == pb.FINISH_REASON_LENGTH  # finished within the grace period
    code, ended, details = results["long"]
    assert code == "UNAVAILABLE" and "shutting down" in str(details)
    assert 2.5 <= ended - t0 <= 8, ended - t0  # cancelled when the 3 s grace period ran out
    code, ended, _ = results["idle"]
    assert code == "UNAVAILABLE" and ended - t0 < 2  # an idle session ends at once
    assert server.process.wait(15) == 0
    event = server.request_event("long")
    assert event["cancel_cause"] == "shutdown" and event["code"] == "UNAVAILABLE"
    assert float(event["cancel_to_done_ms"]) < 1000  # type: ignore[arg-type]


def test_engine_death_turns_health_and_fails_requests(
    random_model_dir: Path, tmp_path: Path
) -> None:
    server = start_server(
        random_model_dir,
        tmp_path / "server.log",
        env={"NIB_FAULT_INJECTION": "warmup_delay_s=3,engine_crash_after_tokens=5"},
        wait_serving=False,
    )
    watch = subprocess.Popen(
        [
            str(GRPCURL),
            "-plaintext",
            "-d",
            '{"service": ""}',
            server.address,
            "grpc.health.v1.Health/Watch",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    seen: list[str] = []

    def read_watch() -> None:
        assert watch.stdout is not None
        buffer = ""
        for line in watch.stdout:
            buffer += line
            if line.startswith("}"):
                seen.extend(str(m["status"]) for m in json_stream(buffer))
                buffer = ""

    reader = threading.Thread(target=read_watch, daemon=True)
    reader.start()
    try:
        detail = fetch_health_detail(server.address, 10)
        assert detail.state == pb.SERVER_STATE_STARTING, detail  # warming up (3 s)
        wait_for(lambda: "SERVING" in seen, 60, "health SERVING")
        assert seen[0] == "NOT_SERVING"  # during the warm-up
        with grpc.insecure_channel(server.address) as channel:
            stub = pb_grpc.CompletionServiceStub(channel)
            with pytest.raises(grpc.RpcError) as info:
                list(stub.Complete(pb.CompleteRequest(prompt="a", max_tokens=50), timeout=30))
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "engine thread died" in info.value.details()
            wait_for(lambda: seen[-1:] == ["NOT_SERVING"], 10, "health NOT_SERVING")
            assert seen == ["NOT_SERVING", "SERVING", "NOT_SERVING"]
            started = time.monotonic()
            with pytest.raises(grpc.RpcError) as info:
                list(stub.Complete(pb.CompleteRequest(prompt="b", max_tokens=5), timeout=30))
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
            assert time.monotonic() - started < 2  # fails at once, does not hang
            responses = list(
                stub.Session(
                    iter([pb.SessionRequest(start=pb.CompleteRequest(prompt="c"))]), timeout=30
                )
            )
            assert responses[-1].done.error_code == grpc.StatusCode.UNAVAILABLE.value[0]
        detail = fetch_health_detail(server.address, 10)
        assert detail.state == pb.SERVER_STATE_FAILED
        assert detail.error.startswith("InjectedCrash: injected crash after 5 tokens")
        died = [e for e in server.events() if e.get("event") == "engine thread died"]
        assert len(died) == 1 and died[0]["level"] == "critical"
        assert "InjectedCrash" in str(died[0].get("exception"))
    finally:
        watch.kill()
        stop_server(server)
    assert server.process.returncode == 0


def test_request_failing_in_the_engine_is_internal_and_logged(
    random_model_dir: Path, tmp_path: Path
) -> None:
    server = start_server(
        random_model_dir,
        tmp_path / "server.log",
        env={"NIB_FAULT_INJECTION": "request_error_after_tokens=3"},
    )
    try:
        with grpc.insecure_channel(server.address) as channel:
            stub = pb_grpc.CompletionServiceStub(channel)
            request = pb.CompleteRequest(prompt="a", max_tokens=10, request_id="boom")
            with pytest.raises(grpc.RpcError) as info:
                list(stub.Complete(request, timeout=30))
            assert info.value.code() == grpc.StatusCode.INTERNAL
            assert "InjectedRequestError" in info.value.details()
            ok = list(stub.Complete(pb.CompleteRequest(prompt="b", max_tokens=2), timeout=30))
            assert ok[-1].done.usage.completion_tokens == 2  # the engine goes on serving
        # Logged on the engine thread, which has no contextvars: the id is passed along.
        failed = [e for e in server.events() if e.get("event") == "request failed"]
        assert len(failed) == 1
        assert failed[0]["request_id"] == "boom" and failed[0]["logger"] == "nib.engine"
        assert server.request_event("boom")["code"] == "INTERNAL"
        assert json.dumps(failed[0])  # one JSON object per line
    finally:
        stop_server(server)
