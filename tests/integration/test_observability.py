"""Metrics and logs of a running server, as an operator reads them."""

from __future__ import annotations

import time

import grpc

from nib.v1 import completion_pb2 as pb
from nib.v1 import completion_pb2_grpc as pb_grpc

from .conftest import ServerProcess, wait_for
from .metrics_util import declared, parse, total, value


def run_session(
    address: str, script: list[pb.SessionRequest], n_done: int
) -> tuple[str, dict[str, pb.Done]]:
    """Send the script (each message once a delta has arrived since the previous one),
    keep the stream open until n_done dones have come; return the session id and dones."""
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.CompletionServiceStub(channel)
        step = {"n": 0}

        def requests():  # type: ignore[no-untyped-def]
            for message in script:
                while step["n"] < 1 and message is not script[0]:
                    time.sleep(0.005)
                step["n"] = 0
                yield message
            while len(dones) < n_done:
                time.sleep(0.01)

        dones: dict[str, pb.Done] = {}
        call = stub.Session(requests(), timeout=60)
        for response in call:
            if response.HasField("delta"):
                step["n"] += 1
            else:
                dones[response.request_id] = response.done
        session_id = dict(call.initial_metadata())["nib-session-id"]
    return session_id, dones


def test_metrics_count_what_happened(fast_server: ServerProcess) -> None:
    before = parse(fast_server.metrics())
    with grpc.insecure_channel(fast_server.address) as channel:
        stub = pb_grpc.CompletionServiceStub(channel)
        responses = list(stub.Complete(pb.CompleteRequest(prompt="x", max_tokens=5), timeout=60))
    assert responses[-1].done.usage.completion_tokens == 5
    _, dones = run_session(
        fast_server.address,
        [
            pb.SessionRequest(
                start=pb.CompleteRequest(prompt="a", max_tokens=400, request_id="m1")
            ),
            pb.SessionRequest(
                start=pb.CompleteRequest(prompt="b", max_tokens=400, request_id="m2")
            ),
            pb.SessionRequest(cancel=pb.Cancel(request_id="m2")),
        ],
        n_done=2,
    )
    assert dones["m1"].finish_reason == pb.FINISH_REASON_SUPERSEDED
    assert dones["m2"].finish_reason == pb.FINISH_REASON_CANCELLED

    def settled() -> bool:
        s = parse(fast_server.metrics())
        return (
            value(s, "nib_inflight_requests") == 0
            and total(s, "nib_requests_total") >= total(before, "nib_requests_total") + 3
        )

    wait_for(settled, 10, "metrics to settle")
    text = fast_server.metrics()
    after = parse(text)

    def delta(name: str, **labels: str) -> float:
        return total(after, name, **labels) - total(before, name, **labels)

    assert delta("nib_requests_total", method="Complete", tenant="anonymous", code="OK") == 1
    assert delta("nib_requests_total", method="Session", tenant="anonymous", code="OK") == 2
    assert delta("nib_supersessions_total", tenant="anonymous") == 1
    assert delta("nib_cancellations_total", tenant="anonymous", cause="request") == 1
    assert delta("nib_completions_finished_total", finish_reason="length") == 1
    assert delta("nib_time_to_first_token_seconds_count") >= 1
    m1_m2_tokens = dones["m1"].usage.completion_tokens + dones["m2"].usage.completion_tokens
    assert delta("nib_generated_tokens_total", tenant="anonymous") == 5 + m1_m2_tokens
    # One inter-token gap per token after the first, for every completion.
    gaps = 4 + sum(max(d.usage.completion_tokens - 1, 0) for d in dones.values())
    assert delta("nib_inter_token_latency_seconds_count") == gaps
    assert delta("nib_engine_tokens_total", phase="decode") == 5 + m1_m2_tokens
    assert value(after, "nib_queue_depth") == 0
    assert value(after, "nib_open_sessions") == 0
    assert value(after, "nib_engine_ready") == 1
    # Declared on a CPU engine, but without samples: absent, not a misleading 0.
    names = declared(text)
    for name in (
        "nib_cuda_memory_allocated_bytes",
        "nib_cuda_memory_reserved_bytes",
        "nib_cuda_memory_allocated_ratio",
        "nib_graph_fallbacks",
    ):
        assert name in names
        assert not [k for k in after if k[0].startswith(name)], name
    assert "request_id" not in text  # bounded labels only


def test_a_session_prompt_is_tokenised_from_its_last_change(fast_server: ServerProcess) -> None:
    """Prompts of one editing session, each a little longer: after the first, the bytes
    they share with the one before are not tokenised again."""
    text = "".join(f"def f{i}(x):\n    return x + {i}\n\n" for i in range(40))
    before = parse(fast_server.metrics())
    prompts = [text[:n] for n in (400, 430, 460)]  # within the test model's 512 tokens
    with grpc.insecure_channel(fast_server.address) as channel:
        stub = pb_grpc.CompletionServiceStub(channel)
        for prompt in prompts:
            request = pb.CompleteRequest(prompt=prompt, max_tokens=1)
            list(stub.Complete(request, metadata=[("nib-session-id", "edit-1")], timeout=60))
    after = parse(fast_server.metrics())

    def delta(kind: str) -> float:
        return total(after, "nib_prompt_bytes_total", kind=kind) - total(
            before, "nib_prompt_bytes_total", kind=kind
        )

    assert delta("reused") > 600  # most of the 2nd and 3rd prompts
    assert delta("tokenised") + delta("reused") >= sum(len(p) for p in prompts)
    assert delta("tokenised") < 400 + 2 * 100


def test_one_log_event_per_request_with_ids_bound(fast_server: ServerProcess) -> None:
    with grpc.insecure_channel(fast_server.address) as channel:
        stub = pb_grpc.CompletionServiceStub(channel)
        list(
            stub.Complete(
                pb.CompleteRequest(prompt="y", max_tokens=4, request_id="log-c"), timeout=60
            )
        )
    session_id, dones = run_session(
        fast_server.address,
        [pb.SessionRequest(start=pb.CompleteRequest(prompt="z", max_tokens=3, request_id="log-s"))],
        n_done=1,
    )
    assert dones["log-s"].finish_reason in (pb.FINISH_REASON_LENGTH, pb.FINISH_REASON_END_OF_TEXT)

    event = fast_server.request_event("log-c")
    assert event["method"] == "Complete" and event["code"] == "OK"
    assert event["tenant"] == "anonymous" and event["completion_tokens"] == 4
    for field in ("queue_ms", "ttft_ms", "total_ms", "itl_median_ms", "itl_max_ms", "timestamp"):
        assert isinstance(event[field], (int, float, str)), field
    s_event = fast_server.request_event("log-s")
    assert s_event["session"] == session_id and s_event["method"] == "Session"

    # Lines logged inside a request carry its ids without the code passing them.
    events = fast_server.events()
    admitted = [e for e in events if e.get("event") == "admitted"]
    assert {"request_id": "log-c", "tenant": "anonymous"}.items() <= next(
        e for e in admitted if e.get("request_id") == "log-c"
    ).items()
    inner = next(e for e in admitted if e.get("request_id") == "log-s")
    assert inner["session"] == session_id and inner["tenant"] == "anonymous"
    opened = [
        e for e in events if e.get("event") == "session opened" and e.get("session") == session_id
    ]
    assert len(opened) == 1 and "request_id" not in opened[0]
