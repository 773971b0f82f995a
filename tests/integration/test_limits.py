"""Limits and bad input against a running server: a status naming the field and the
limit, a full queue, message size, deadlines that free the engine."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from nib.v1 import completion_pb2 as pb
from nib.v1 import completion_pb2_grpc as pb_grpc

from .conftest import ServerProcess, start_server, stop_server, wait_for
from .metrics_util import parse, value

STEP_DELAY_S = 0.02  # every decode step takes at least this long on the tight server


@pytest.fixture(scope="module")
def tight_server(
    random_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """One request may wait; every step is slowed so that long requests stay long."""
    log = tmp_path_factory.mktemp("logs") / "tight-server.log"
    proc = start_server(
        random_model_dir,
        log,
        "--max-queue",
        "1",
        env={"NIB_FAULT_INJECTION": f"step_delay_s={STEP_DELAY_S}"},
        metrics=True,
    )
    yield proc
    stop_server(proc)


def stub_for(address: str) -> tuple[grpc.Channel, pb_grpc.CompletionServiceStub]:
    channel = grpc.insecure_channel(address)
    return channel, pb_grpc.CompletionServiceStub(channel)


def status_of(call: object) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as info:
        list(call)  # type: ignore[call-overload]
    return info.value.code(), info.value.details()


@pytest.mark.parametrize(
    ("request_kwargs", "message"),
    [
        ({"prompt": "x", "max_tokens": 1025}, "max_tokens: is 1025; must be at most 1024"),
        ({"prompt": "x", "top_k": 10**6}, "top_k: is 1000000; must be at most the vocabulary size"),
        ({"prompt": "x", "top_p": 1.5}, "top_p: is 1.5; must be between 0 and 1"),
        ({"prompt": "x", "stop": ["s"] * 17}, "stop: has 17 strings; at most 16 allowed"),
        ({"prompt": "a" * 600}, "prompt: is 600 tokens; the context holds 512"),
        ({"infill": pb.Infill(prefix="a" * 300, suffix="b" * 300)}, "infill: is 60"),
        ({}, "prompt: one of prompt or infill is required"),
    ],
)
def test_bad_input_names_field_and_limit(
    fast_server: ServerProcess, request_kwargs: dict[str, object], message: str
) -> None:
    channel, stub = stub_for(fast_server.address)
    with channel:
        code, details = status_of(stub.Complete(pb.CompleteRequest(**request_kwargs), timeout=30))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert details.startswith(message), details


def test_message_size_limit(fast_server: ServerProcess) -> None:
    channel, stub = stub_for(fast_server.address)
    with channel:
        huge = pb.CompleteRequest(prompt="x" * (5 * 1024 * 1024))
        code, details = status_of(stub.Complete(huge, timeout=30))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "4194304" in details  # the limit, in bytes
        ok = list(stub.Complete(pb.CompleteRequest(prompt="x", max_tokens=2), timeout=30))
    assert ok[-1].done.usage.completion_tokens == 2


def first_delta(stream: Iterator[pb.CompleteResponse]) -> None:
    assert next(stream).HasField("delta")


def test_full_queue_is_resource_exhausted(tight_server: ServerProcess) -> None:
    channel, stub = stub_for(tight_server.address)
    with channel:
        running = stub.Complete(pb.CompleteRequest(prompt="a", max_tokens=1000), timeout=60)
        first_delta(running)  # the engine runs it: the queue is empty
        waiting = stub.Complete(pb.CompleteRequest(prompt="b", max_tokens=1000), timeout=60)
        # The second one waits in the queue (its first message would take ~20 s).
        wait_for(lambda: value(parse(tight_server.metrics()), "nib_queue_depth") == 1, 10, "queued")
        code, details = status_of(
            stub.Complete(pb.CompleteRequest(prompt="c", max_tokens=5), timeout=30)
        )
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert details == "1 requests are already waiting (the queue holds at most 1)"

        # On a session the same rejection is a Done with error_code 8; the session lives on.
        def requests() -> Iterator[pb.SessionRequest]:
            yield pb.SessionRequest(start=pb.CompleteRequest(prompt="d", request_id="full"))

        responses = list(stub.Session(requests(), timeout=30))
        assert [r.request_id for r in responses] == ["full"]
        assert responses[0].done.finish_reason == pb.FINISH_REASON_ERROR
        assert responses[0].done.error_code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
        running.cancel()
        waiting.cancel()
        # Both cancels reach the engine: a new request starts at once.
        after = list(stub.Complete(pb.CompleteRequest(prompt="e", max_tokens=2), timeout=30))
    assert after[-1].done.timings.queue_ms < 2000


def test_deadline_exceeded_frees_the_engine(tight_server: ServerProcess) -> None:
    channel, stub = stub_for(tight_server.address)
    with channel:
        call = stub.Complete(
            pb.CompleteRequest(prompt="a", max_tokens=1000, request_id="late"), timeout=0.8
        )
        started = time.monotonic()
        code, _ = status_of(call)
        assert code == grpc.StatusCode.DEADLINE_EXCEEDED
        assert time.monotonic() - started < 5
        after = list(stub.Complete(pb.CompleteRequest(prompt="e", max_tokens=2), timeout=30))
    # Had the engine gone on with 1000 tokens (>= 20 s), this one would wait behind them.
    assert after[-1].done.timings.queue_ms < 1000
    event = tight_server.request_event("late")
    assert event["code"] == "DEADLINE_EXCEEDED" and event["cancel_cause"] == "deadline"
    assert event["finish_reason"] == "cancelled"
    assert 0 < event["completion_tokens"] < 100  # type: ignore[operator]
    # The engine let go within a decode step of the cancel.
    assert event["cancel_to_done_ms"] <= 2 * event["itl_max_ms"] + 50  # type: ignore[operator]


def test_session_deadline(tight_server: ServerProcess) -> None:
    channel, stub = stub_for(tight_server.address)
    hold = threading.Event()

    def requests() -> Iterator[pb.SessionRequest]:
        yield pb.SessionRequest(start=pb.CompleteRequest(prompt="a", max_tokens=1000))
        hold.wait(10)

    with channel:
        code, _ = status_of(stub.Session(requests(), timeout=0.8))
        hold.set()
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED
