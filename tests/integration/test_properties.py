"""Property-based: generated requests thrown at the running server each get a well-formed
answer or a proper status, and the server keeps serving."""

from __future__ import annotations

import re
from collections.abc import Iterator

import grpc
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from nib.sdk import Client
from nib.v1 import completion_pb2 as pb
from nib.v1 import completion_pb2_grpc as pb_grpc

from .conftest import ServerProcess

FIELDS = r"(prompt|infill(\.path|\.language)?|max_tokens|temperature|top_k|top_p|stop|request_id)"
FIELD_MESSAGE = re.compile(rf"^{FIELDS}: \S")
FINISHED = {
    pb.FINISH_REASON_LENGTH,
    pb.FINISH_REASON_STOP,
    pb.FINISH_REASON_END_OF_TEXT,
}

text = st.text(st.characters(exclude_categories=("Cs",)), max_size=24)
long_text = st.text(st.characters(codec="ascii"), min_size=500, max_size=700)
floats = st.floats(width=32) | st.floats(0, 2, width=32)


@st.composite
def complete_requests(draw: st.DrawFn) -> pb.CompleteRequest:
    req = pb.CompleteRequest(
        # In range: short, to keep the run bounded; out of range: anything.
        max_tokens=draw(st.integers(0, 24) | st.integers(1025, 2**32 - 1)),
        temperature=draw(floats),
        top_k=draw(st.integers(0, 40) | st.integers(0, 2**32 - 1)),
        top_p=draw(floats),
        stop=draw(st.lists(st.text(max_size=3) | st.text(min_size=250, max_size=260), max_size=18)),
        logprobs=draw(st.booleans()),
        request_id=draw(st.text(max_size=8) | st.text(min_size=125, max_size=135)),
    )
    kind = draw(st.sampled_from(["prompt", "infill", "none"]))
    if kind == "prompt":
        req.prompt = draw(text | long_text)
    elif kind == "infill":
        req.infill.CopyFrom(
            pb.Infill(
                prefix=draw(text | long_text),
                suffix=draw(text),
                path=draw(text | st.text(min_size=1020, max_size=1030)),
                language=draw(text),
            )
        )
    if draw(st.booleans()):
        req.seed = draw(st.integers(0, 2**64 - 1))
    if not req.max_tokens:
        req.max_tokens = draw(st.integers(0, 24))  # 0: the server's default (64)
    return req


def check_stream(request: pb.CompleteRequest, responses: list[pb.CompleteResponse]) -> None:
    assert responses, "a stream that ends OK carries at least its done"
    *deltas, last = responses
    assert last.HasField("done") and all(r.HasField("delta") for r in deltas)
    done = last.done
    assert done.finish_reason in FINISHED, done
    ids = [i for r in deltas for i in r.delta.token_ids]
    logprobs = [p for r in deltas for p in r.delta.logprobs]
    assert done.usage.completion_tokens == len(ids)
    assert done.usage.completion_tokens <= (request.max_tokens or 64)
    assert len(logprobs) == (len(ids) if request.logprobs else 0)
    assert all(p <= 0 for p in logprobs)
    assert len({r.request_id for r in responses}) == 1
    if request.request_id:
        assert responses[0].request_id == request.request_id
    assert done.timings.total_ms >= done.timings.queue_ms >= 0


@pytest.fixture(scope="module")
def stub(fast_server: ServerProcess) -> Iterator[pb_grpc.CompletionServiceStub]:
    with grpc.insecure_channel(fast_server.address) as channel:
        yield pb_grpc.CompletionServiceStub(channel)


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(request=complete_requests())
# Found by this test: the smallest normal float32 temperature overflowed the sampler.
@example(request=pb.CompleteRequest(prompt="0.", max_tokens=8, temperature=1.17549435e-38))
def test_every_request_gets_an_answer_or_a_proper_status(
    stub: pb_grpc.CompletionServiceStub, request: pb.CompleteRequest
) -> None:
    try:
        responses = list(stub.Complete(request, timeout=60))
    except grpc.RpcError as exc:
        assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, (exc.code(), exc.details())
        assert FIELD_MESSAGE.match(exc.details() or ""), exc.details()
        return
    check_stream(request, responses)


actions = st.lists(
    st.one_of(
        st.tuples(st.just("start"), complete_requests()),
        st.tuples(st.just("cancel"), st.sampled_from(["", "last", "unknown"])),
        st.tuples(st.just("empty"), st.none()),
    ),
    min_size=1,
    max_size=6,
)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(script=actions)
def test_sessions_answer_every_start_exactly_once(
    stub: pb_grpc.CompletionServiceStub, script: list[tuple[str, object]]
) -> None:
    messages: list[pb.SessionRequest] = []
    starts: list[str] = []
    for i, (kind, arg) in enumerate(script):
        if kind == "start":
            assert isinstance(arg, pb.CompleteRequest)
            arg.request_id = f"s{i}"  # unique, so every answer can be told apart
            starts.append(arg.request_id)
            messages.append(pb.SessionRequest(start=arg))
        elif kind == "cancel":
            target = {"": "", "unknown": "nobody", "last": starts[-1] if starts else ""}[str(arg)]
            messages.append(pb.SessionRequest(cancel=pb.Cancel(request_id=target)))
        else:
            messages.append(pb.SessionRequest())
    dones: dict[str, list[pb.Done]] = {}
    finished_after_done: list[str] = []
    for response in stub.Session(iter(messages), timeout=120):
        if response.request_id in dones and response.request_id:
            finished_after_done.append(response.request_id)
        if response.HasField("done"):
            dones.setdefault(response.request_id, []).append(response.done)
    assert not finished_after_done, "nothing may follow a request's done"
    assert sorted(k for k in dones if k) == sorted(starts)
    assert all(len(dones[rid]) == 1 for rid in starts)
    empties = sum(1 for kind, _ in script if kind == "empty")
    rejected_unnamed = dones.get("", [])
    assert len(rejected_unnamed) == empties
    for rid in starts:
        done = dones[rid][0]
        if done.finish_reason == pb.FINISH_REASON_ERROR:
            assert done.error_code == grpc.StatusCode.INVALID_ARGUMENT.value[0], done
            assert FIELD_MESSAGE.match(done.error), done.error
        else:
            assert done.finish_reason in FINISHED | {
                pb.FINISH_REASON_CANCELLED,
                pb.FINISH_REASON_SUPERSEDED,
            }
    # Every start but the last that ran was superseded or had already finished.
    ran = [rid for rid in starts if dones[rid][0].finish_reason != pb.FINISH_REASON_ERROR]
    for rid in ran[:-1]:
        assert dones[rid][0].finish_reason != pb.FINISH_REASON_CANCELLED or any(
            kind == "cancel" for kind, _ in script
        )


def test_server_still_serves_after_the_properties(fast_server: ServerProcess) -> None:
    with Client(fast_server.address) as client:
        assert client.health() == "SERVING"
        stream = client.complete("still here", max_tokens=3)
        list(stream)
    assert stream.usage.completion_tokens == 3
