"""One completion end to end: real server process, real SDK, real CLI, on loopback."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import grpc
import pytest

from nib.sdk import Client, InvalidArgument
from nib.v1 import completion_pb2 as pb
from nib.v1 import completion_pb2_grpc as pb_grpc

from .conftest import ServerProcess, free_port


def test_stream_arrives_token_by_token(server: ServerProcess) -> None:
    with Client(server.address) as client:
        stream = client.complete("def add(a, b):", max_tokens=24, temperature=0.8, seed=3)
        arrivals = []
        for text in stream:
            arrivals.append((time.perf_counter(), text))
    assert stream.finish_reason in ("length", "end_of_text")
    assert stream.text == "".join(t for _, t in arrivals)
    assert len(arrivals) > 3, "text should arrive in several deltas, not in one piece"
    assert stream.usage.completion_tokens == len(stream.token_ids) > 0
    assert arrivals[-1][0] - arrivals[0][0] > 0  # spread out in time
    assert stream.timings.ttft_ms > 0


def test_cancelled_request_does_not_delay_the_next(server: ServerProcess) -> None:
    with Client(server.address) as client:
        # How long do 200 tokens take here?
        probe = client.complete("z", max_tokens=200, temperature=1.0, seed=2)
        list(probe)
        per_token_ms = probe.timings.total_ms / max(probe.usage.completion_tokens, 1)
        stream = client.complete("x", max_tokens=1000, temperature=1.0, seed=1)
        for i, _ in enumerate(stream):
            if i == 3:
                break
        stream.cancel()
        assert stream.finish_reason == "cancelled" and len(stream.token_ids) < 10
        nxt = client.complete("y", max_tokens=4)
        list(nxt)
    # Had the cancel not reached the engine, the next request would queue behind
    # ~1000 tokens; it may wait for at most a few steps.
    assert nxt.timings.queue_ms < 20 * per_token_ms + 200, (nxt.timings, per_token_ms)


def test_bad_parameters_get_invalid_argument_naming_the_field(server: ServerProcess) -> None:
    with Client(server.address) as client:
        with pytest.raises(InvalidArgument, match="max_tokens: is 100000; must be at most 1024"):
            list(client.complete("x", max_tokens=100000))
        with pytest.raises(InvalidArgument, match="prompt: must not be empty"):
            list(client.complete(""))
        with pytest.raises(InvalidArgument, match=r"prompt: is \d+ tokens; the context holds \d+"):
            list(client.complete("x = 1\n" * 3000))
        # The server keeps serving after rejecting.
        assert "".join(client.complete("ok", max_tokens=3)) is not None


def test_session_supersedes_the_running_completion(server: ServerProcess) -> None:
    with grpc.insecure_channel(server.address) as channel:
        stub = pb_grpc.CompletionServiceStub(channel)
        first = pb.CompleteRequest(
            prompt="a", max_tokens=1000, temperature=1.0, seed=1, request_id="one"
        )
        second = pb.CompleteRequest(prompt="b", max_tokens=5, request_id="two")
        sent_second = False

        def requests():  # type: ignore[no-untyped-def]
            yield pb.SessionRequest(start=first)
            while not sent_second:
                time.sleep(0.01)
            yield pb.SessionRequest(start=second)

        done: dict[str, pb.Done] = {}
        deltas: dict[str, int] = {"one": 0, "two": 0}
        for response in stub.Session(requests(), timeout=60):
            if response.HasField("delta"):
                deltas[response.request_id] += 1
                if response.request_id == "one" and deltas["one"] == 3:
                    sent_second = True
            else:
                done[response.request_id] = response.done
                if len(done) == 2:
                    break
    assert done["one"].finish_reason == pb.FINISH_REASON_SUPERSEDED
    assert done["one"].usage.completion_tokens < 1000
    assert done["two"].finish_reason in (pb.FINISH_REASON_LENGTH, pb.FINISH_REASON_END_OF_TEXT)


def test_cli_complete_and_health(server: ServerProcess) -> None:
    env = {**os.environ, "NIB_ADDRESS": server.address}
    out = subprocess.run(
        [sys.executable, "-m", "nib.sdk.cli", "complete", "--max-tokens", "8", "-v", "def f():"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "ttft" in out.stderr and "completion" in out.stderr
    health = subprocess.run(
        [sys.executable, "-m", "nib.sdk.cli", "health"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert health.returncode == 0 and health.stdout.strip() == "SERVING"
    nobody = subprocess.run(
        [
            sys.executable,
            "-m",
            "nib.sdk.cli",
            "health",
            "--address",
            f"127.0.0.1:{free_port()}",
            "--timeout",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert nobody.returncode != 0 and "UNAVAILABLE" in nobody.stderr + nobody.stdout
