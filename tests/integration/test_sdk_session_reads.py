"""Who reads a synchronous Session call: the thread that iterates a completion takes its
responses off the call itself (no thread hop per token, as on a `Complete` call), and
the cases that makes hard: a cancel or a deadline while that thread waits inside the
call, two threads reading one session, the session closed under a reader, a call that
dies while a caller reads it and while nobody does.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest

from nib.sdk import NO_RETRY, Client, DeadlineExceeded, FinishReason, Unavailable
from nib.sdk import client as sdk_client
from nib.sdk.session import CANCEL_GRACE_S
from nib.v1 import completion_pb2 as pb

from .conftest import ServerProcess, assert_cancelled_on_server, assert_engine_free, wait_for
from .fake_server import FakeServer, Script, start_fake

LONG = {"max_tokens": 1000, "temperature": 1.0, "seed": 1}
PROMPT = "def add(a, b):\n"


class Reads(grpc.StreamStreamClientInterceptor):  # type: ignore[misc]
    """Wraps every Session call the client makes: records which thread took each
    response off the call, and which threads are waiting inside its next() right now."""

    def __init__(self) -> None:
        self.taken: list[tuple[int, str]] = []  # (thread ident, request_id)
        self._inside: set[int] = set()
        self._cond = threading.Condition()

    def intercept_stream_stream(
        self, continuation: Callable[..., Any], details: Any, requests: Iterator[Any]
    ) -> Any:
        return _RecordedCall(continuation(details, requests), self)

    def by(self, request_id: str) -> list[int]:
        """The threads that took request_id's responses off the call, one per response."""
        return [ident for ident, rid in self.taken if rid == request_id]

    def wait_inside(self, ident: int, timeout: float) -> bool:
        """Whether thread `ident` came to wait inside a call's next() within timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: ident in self._inside, timeout)

    def next_of(self, call: Any) -> pb.SessionResponse:
        ident = threading.get_ident()
        with self._cond:
            self._inside.add(ident)
            self._cond.notify_all()
        try:
            response: pb.SessionResponse = next(call)
        finally:
            with self._cond:
                self._inside.discard(ident)
        self.taken.append((ident, response.request_id))
        return response


class _RecordedCall:
    def __init__(self, call: Any, reads: Reads) -> None:
        self._call = call
        self._reads = reads

    def __iter__(self) -> _RecordedCall:
        return self

    def __next__(self) -> pb.SessionResponse:
        return self._reads.next_of(self._call)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._call, name)


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Reads:
    """Every Client made in the test records its Session calls' reads here."""
    recorder = Reads()
    real = sdk_client.open_channel
    monkeypatch.setattr(
        sdk_client, "open_channel", lambda options: grpc.intercept_channel(real(options), recorder)
    )
    return recorder


@pytest.fixture
def stalling() -> Iterator[FakeServer]:
    """A scripted server whose completions stall before their first token and that
    never answers a cancel: a caller waits inside the call until something ends it."""
    server = start_fake(Script(stall_s=60))
    yield server
    server.stop()


def cancel_when_inside(
    reads: Reads, ident: int, cancel: Callable[[], None]
) -> list[tuple[bool, float]]:
    """On a thread of its own: call cancel() once thread `ident` waits inside the call
    (or after 30 s, so that the test ends either way). Just before, the list it returns
    gets whether the thread was inside, and the time."""
    seen: list[tuple[bool, float]] = []

    def run() -> None:
        inside = reads.wait_inside(ident, timeout=30)
        seen.append((inside, time.monotonic()))
        cancel()

    threading.Thread(target=run, daemon=True).start()
    return seen


def test_the_iterating_thread_reads_its_own_responses(server: ServerProcess, reads: Reads) -> None:
    """Every response of a completion is taken off the call by the thread that iterates
    it (a reader thread that hands them over, one hop per token, fails this), and no
    thread starts for the completion."""
    with Client(server.address) as client, client.session() as session:
        session.complete(PROMPT, max_tokens=2).result()  # the Session call is open
        before = set(threading.enumerate())
        stream = session.complete(PROMPT, max_tokens=32)
        during = None
        for _text in stream:
            during = set(threading.enumerate())
    assert during is not None, "the completion brought no text"
    readers = reads.by(stream.request_id)
    assert len(readers) >= 2, readers  # its deltas and its done
    assert set(readers) == {threading.get_ident()}, "a response crossed from another thread"
    assert during - before == set(), sorted(t.name for t in during - before)


def test_a_cancel_from_another_thread_wakes_the_reader_with_the_servers_answer(
    slow_server: ServerProcess, reads: Reads
) -> None:
    with Client(slow_server.address) as client, client.session() as session:
        stream = session.complete("x", **LONG)
        it = iter(stream)
        next(it)  # it generates
        inside = cancel_when_inside(reads, threading.get_ident(), stream.cancel)
        rest = list(it)
        assert inside[0][0], "the cancel came before the caller waited inside the call"
        assert stream.finish_reason == FinishReason.CANCELLED and len(rest) < 50
        assert stream.server_done.wait(10), "the server's done never reached server_done"
        assert 1 <= stream.usage.completion_tokens < 50
        assert_engine_free(client)
    # "request": the cancel on the stream ended it, not the link closed after the grace.
    assert_cancelled_on_server(slow_server, stream.request_id, "request")


def test_a_cancel_the_server_never_answers_still_ends_the_loop(
    stalling: FakeServer, reads: Reads
) -> None:
    with Client(stalling.address) as client, client.session() as session:
        stream = session.complete("x")
        # A cancel is "never answered" only by a server that holds the call: one sent
        # before the call reached it would end a call the server never saw.
        wait_for(lambda: len(stalling.servicer.records) == 1, 30, "the server to take the call")
        inside = cancel_when_inside(reads, threading.get_ident(), stream.cancel)
        assert list(stream) == []
        ended = time.monotonic()
        ((was_inside, cancelled_at),) = inside
        assert was_inside, "the cancel came before the caller waited inside the call"
        assert stream.finish_reason == FinishReason.CANCELLED
        assert ended - cancelled_at < CANCEL_GRACE_S + 2.0  # the grace closed the link
        assert not stream.server_done.is_set()  # no answer came: the link was closed
        stalling.servicer.script.stall_s = 0
        after = session.complete("x").result()  # on a new link
    assert after.text == "Hello, world"
    assert [r.method for r in stalling.servicer.records] == ["Session", "Session"]


def test_a_deadline_passes_while_the_caller_waits_inside_the_call(
    stalling: FakeServer, reads: Reads
) -> None:
    with Client(stalling.address, retry=NO_RETRY) as client, client.session() as session:
        start = time.monotonic()
        with pytest.raises(DeadlineExceeded, match="deadline"):
            session.complete("x", timeout=0.3).result()
        elapsed = time.monotonic() - start
        assert 0.3 <= elapsed < 0.3 + CANCEL_GRACE_S + 2.0, elapsed
        stalling.servicer.script.stall_s = 0
        assert session.complete("x", timeout=10).result().text == "Hello, world"


def test_a_deadline_on_the_real_server_is_answered_on_time(
    slow_server: ServerProcess, reads: Reads
) -> None:
    with Client(slow_server.address) as client, client.session() as session:
        start = time.monotonic()
        stream = session.complete("x", timeout=1.0, **LONG)
        with pytest.raises(DeadlineExceeded):
            for _ in stream:
                pass
        elapsed = time.monotonic() - start
        # The caller reads its own tokens, so the deadline passes while it waits inside the
        # call (or between two tokens): the cancel sent then is answered within a step.
        assert set(reads.by(stream.request_id)[:3]) == {threading.get_ident()}
        assert 1.0 <= elapsed < 1.0 + CANCEL_GRACE_S, elapsed
        assert stream.server_done.wait(10)
        assert_engine_free(client)
    assert_cancelled_on_server(slow_server, stream.request_id, "request")


def test_two_threads_read_two_completions_of_one_session(
    slow_server: ServerProcess, reads: Reads
) -> None:
    outcome: dict[str, object] = {}
    three = threading.Event()

    with Client(slow_server.address) as client, client.session() as session:
        first = session.complete("a", **LONG)

        def read_first() -> None:
            try:
                for _ in first:
                    if len(first.token_ids) >= 3:
                        three.set()
                outcome["first"] = first.finish_reason
            except BaseException as exc:
                outcome["first"] = exc
            finally:
                three.set()

        reader = threading.Thread(target=read_first)
        reader.start()
        assert three.wait(60)
        second = session.complete("b", max_tokens=5).result()
        reader.join(60)
        assert not reader.is_alive(), "the first completion's loop never ended"
    assert outcome["first"] == FinishReason.SUPERSEDED, outcome
    assert first.usage.completion_tokens < 50
    assert second.finish_reason in ("length", "end_of_text")
    assert reads.by(first.request_id)[:3] == [reader.ident] * 3
    # Nobody but the two callers read: one of them always wanted a response.
    assert {ident for ident, _ in reads.taken} <= {reader.ident, threading.get_ident()}


def test_closing_the_session_ends_a_loop_waiting_inside_the_call(
    stalling: FakeServer, reads: Reads
) -> None:
    outcome: list[object] = []
    with Client(stalling.address) as client:
        session = client.session()
        stream = session.complete("x")

        def read() -> None:
            outcome.append(list(stream))

        reader = threading.Thread(target=read)
        reader.start()
        assert reader.ident is not None
        assert reads.wait_inside(reader.ident, timeout=30)
        session.close()
        reader.join(10)
        assert not reader.is_alive(), "close() left the loop waiting"
    assert outcome == [[]] and stream.finish_reason == FinishReason.CANCELLED
    with pytest.raises(RuntimeError, match="closed"):
        session.complete("x")


def test_the_call_dies_under_a_caller_reading_it(stalling: FakeServer, reads: Reads) -> None:
    port = int(stalling.address.rsplit(":", 1)[1])
    with Client(stalling.address, retry=NO_RETRY) as client, client.session() as session:
        stream = session.complete("x")
        # The caller waits inside next() before the call has even connected; a server
        # stopped then never had the call (the connect is refused, or its shutdown cancels
        # the call: CANCELLED), and the channel is left in reconnect backoff.
        wait_for(lambda: len(stalling.servicer.records) == 1, 30, "the server to take the call")
        inside = cancel_when_inside(reads, threading.get_ident(), stalling.stop)
        with pytest.raises(Unavailable):
            list(stream)
        assert inside[0][0], "the server went away before the caller waited inside"
        back = start_fake(Script(), port=port)
        try:
            after = session.complete("x")
            assert after.result().text == "Hello, world" and after.attempts == 1
        finally:
            back.stop()


def test_the_call_dies_while_nobody_reads_and_the_next_start_reopens(
    reads: Reads,
) -> None:
    first = start_fake(Script())
    port = int(first.address.rsplit(":", 1)[1])
    with Client(first.address, retry=NO_RETRY) as client, client.session() as session:
        assert session.complete("x").result().text == "Hello, world"
        first.stop()
        # Nobody iterates: the link's reader thread notices the end and lets the link go.
        wait_for(lambda: session._link is None, 10, "the session to notice its call ended")
        back = start_fake(Script(), port=port)
        try:
            after = session.complete("x")
            assert after.result().text == "Hello, world" and after.attempts == 1
            assert [r.method for r in back.servicer.records] == ["Session"]
        finally:
            back.stop()
