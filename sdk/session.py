"""A session on the bidirectional `Session` RPC, for the synchronous client.

An editor starts a completion on every keystroke; on a session each new
start supersedes the one in flight (the server ends it with `superseded`),
and a cancel travels on the same stream, so nothing waits for a new call.

The thread that iterates a completion reads the call itself, as iterating a
`Complete` call does: on its way to the caller a token crosses only gRPC's
channel spin thread, which every bidirectional call has (a reader thread of
ours handing each over through a queue cost ~0.17 ms per token on the GPU
host, bench/README.md). The link's reader thread reads only when no caller
does: responses for completions nobody iterates yet, the done that confirms a
cancel, the end of the call.
"""

from __future__ import annotations

import math
import queue
import threading
import time
from collections.abc import Iterator
from types import TracebackType
from typing import Any, TypeAlias, Unpack

import grpc

from nib.sdk.errors import DeadlineExceeded
from nib.sdk.request import CompletionParams, build_request
from nib.sdk.session_core import Link, SessionCore
from nib.sdk.state import StreamState
from nib.sdk.types import Completion
from nib.v1 import completion_pb2 as pb

_WAKE = object()  # put on a stream's queue to end its loop at once
_POKE = object()  # put on a waiting caller's queue: the turn to read the call is free
_Item: TypeAlias = pb.SessionResponse | grpc.RpcError | object | None

# Nothing but a response wakes a caller inside the call's next(). A cancel (or a passed
# deadline, which sends one) is answered by the server within a decode step; when no
# response came this long after it, the link is closed, which wakes the caller (the next
# start opens a new link).
CANCEL_GRACE_S = 0.5
# The reader thread reads for a completion that is expecting responses only after no
# caller read for this long: a caller between two tokens is back within microseconds,
# and would otherwise find the reader thread inside next() and get its token second-hand.
IDLE_S = 0.1


def deadline_passed() -> DeadlineExceeded:
    return DeadlineExceeded(grpc.StatusCode.DEADLINE_EXCEEDED, "the completion's deadline passed")


class SessionStream(StreamState):
    """One completion of a session; iterate it like a CompletionStream.

    When a newer completion starts on the same session this one ends with
    finish_reason `superseded`. A deadline (`timeout`) is this completion's
    own: when it passes the completion is cancelled and DeadlineExceeded raised.
    After cancel(), `server_done` is set once the server confirmed the end,
    and `usage` then counts what the server generated.
    """

    def __init__(
        self, session: Session, request: pb.CompleteRequest, timeout: float | None
    ) -> None:
        super().__init__(request.request_id)
        self.request = request
        self.link: Link | None = None
        self.server_done = threading.Event()
        self._session = session
        self._events: queue.Queue[_Item] = queue.Queue()
        self._deadline = None if timeout is None else time.monotonic() + timeout
        self._cancelled_at: float | None = None
        self._expired = False  # the deadline passed while the caller was inside the call

    def _remaining(self) -> float | None:
        return None if self._deadline is None else max(self._deadline - time.monotonic(), 0.0)

    def _due(self) -> float | None:
        """When the reader thread must act for this stream's caller if it is still inside
        the call's next(): at the deadline, or at the end of a cancel's grace."""
        if self._cancelled_at is not None:
            return self._cancelled_at + CANCEL_GRACE_S
        return None if self.done else self._deadline

    def __iter__(self) -> Iterator[str]:
        self._check_iterable()
        return self._deltas()

    def _deltas(self) -> Iterator[str]:
        try:
            while not self.done:
                assert isinstance(self.link, _ThreadLink)
                item = self.link.next_for(self)
                if self._expired:
                    raise deadline_passed()
                if item is _WAKE or self.cancelled:
                    return
                if isinstance(item, grpc.RpcError):
                    self._retry_or_raise(item)
                elif isinstance(item, pb.SessionResponse):
                    text = self._apply(item)
                    if text:
                        yield text
                else:
                    raise self._ended_without_done()
        finally:
            self.cancel()

    def _retry_or_raise(self, exc: grpc.RpcError) -> None:
        retry = self._session.options.retry
        until = time.monotonic() + self._backoff_or_raise(retry, exc, self._remaining())
        while (left := until - time.monotonic()) > 0:
            try:
                item = self._events.get(timeout=left)  # a cancel() cuts the backoff short
            except queue.Empty:
                break
            if item is not _POKE:
                self._events.put(item)
                return
        self.attempts += 1
        self._session._resend(self)

    def _wait(self) -> _Item:
        """The next item that whoever reads the call routed to this stream."""
        try:
            return self._events.get(timeout=self._remaining())
        except queue.Empty:
            raise deadline_passed() from None

    def _arrived(self, response: pb.SessionResponse) -> None:
        """A response for this completion came off the call (on whichever thread read it)."""
        if response.HasField("done"):
            if self.cancelled:
                self._record_done(response.done)
            self.server_done.set()

    def _deliver(self, item: pb.SessionResponse | grpc.RpcError | None) -> None:
        """From another thread than this stream's caller: a response for it, or its link's end."""
        if isinstance(item, pb.SessionResponse):
            self._arrived(item)
        self._events.put(item)

    def _wake(self) -> None:
        self._events.put(_WAKE)

    def _expire(self) -> None:
        """The deadline passed while the caller was inside the call: cancel, and let the
        server's answer wake the caller to raise DeadlineExceeded."""
        if not self.done:
            self._expired = True
            self.cancel()

    def cancel(self) -> None:
        """Stop the generation on the server; safe from any thread; no-op once ended."""
        if self._mark_cancelled():
            self._cancelled_at = time.monotonic()
            self._session._send_cancel(self)
            self._wake()

    close = cancel

    def result(self) -> Completion:
        """Wait for the end (consuming the deltas not read yet) and return the completion."""
        if not getattr(self, "_iterated", False):
            for _ in self:
                pass
        if not self.done:
            raise RuntimeError("result() while another loop is still reading this stream")
        return self._result()

    def __enter__(self) -> SessionStream:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cancel()


class _ThreadLink:
    """One Session call. gRPC's own thread sends `outbox`; responses are read by one
    thread at a time (the turn): a caller that wants its next one, which routes those
    for other completions to their queues, else the link's reader thread."""

    def __init__(self, session: Session, stub: Any) -> None:
        self.alive = True
        self._session = session
        self._outbox: queue.Queue[pb.SessionRequest | None] = queue.Queue()
        self._turn = threading.Lock()  # held by whoever calls next() on the call
        self._cond = threading.Condition(threading.Lock())  # for the fields below
        self._waiting: set[SessionStream] = set()  # callers wanting their next item
        self._epoch = 0  # moves with every message sent and every caller's read
        self._urgent = False  # the call ended or was closed: read it to its end now
        self._ended = False
        self._holder: SessionStream | None = None  # its caller is inside next(call)
        self._wake_at = math.inf  # when the reader thread looks at the holder next
        self._call = stub.Session(
            iter(self._outbox.get, None),
            metadata=session.options.metadata(session.session_id) or None,
        )
        self._call.add_done_callback(self._call_done)
        threading.Thread(target=self._read_idle, name="nib-session-reader", daemon=True).start()

    def send(self, message: pb.SessionRequest) -> None:
        self._outbox.put(message)
        with self._cond:
            self._epoch += 1
            self._cond.notify()

    def close(self) -> None:
        self.alive = False
        self._call.cancel()
        self._outbox.put(None)
        self._call_done()

    def _call_done(self, _call: object = None) -> None:
        with self._cond:
            self._urgent = True
            self._cond.notify()

    def next_for(self, stream: SessionStream) -> _Item:
        """stream's next item, for its caller: read off the call by this very thread while
        the turn is free (what is for other completions goes to their queues), else taken
        off its queue, where whoever holds the turn puts it."""
        with self._cond:
            self._waiting.add(stream)
            self._epoch += 1
        try:
            while True:
                if self._turn.acquire(blocking=False):
                    try:
                        item = self._read_for(stream)
                    finally:
                        self._turn.release()
                        self._pass_turn(stream)
                    if item is not None:
                        return item
                item = stream._wait()
                if item is not _POKE:
                    return item
        finally:
            with self._cond:
                self._waiting.discard(stream)
                self._epoch += 1
                if stream.cancelled and not self._waiting:
                    self._cond.notify()  # its confirming done is the reader thread's to read

    def _read_for(self, stream: SessionStream) -> _Item | None:
        """With the turn: stream's next item, off its queue or off the call; None when the
        call has ended (its end is on the queue of every completion that was on it)."""
        while True:
            if not stream._events.empty():
                item = stream._events.get_nowait()
                if item is not _POKE:
                    return item
            elif stream.done:
                return _WAKE
            elif self._ended:
                return None
            elif (response := self._next_response(stream)) is not None:
                target = self._session._take(response)
                if target is stream:
                    stream._arrived(response)
                    return response
                if target is not None:
                    target._deliver(response)

    def _next_response(self, reader: SessionStream | None) -> pb.SessionResponse | None:
        """next(call), with the turn; None once the call ended (then ended for everyone)."""
        if reader is not None:
            if reader._remaining() == 0.0:
                raise deadline_passed()
            if (due := reader._due()) is None:
                self._holder = reader
            else:
                with self._cond:
                    self._holder = reader
                    if due < self._wake_at:
                        self._cond.notify()  # the reader thread must look at it by then
        try:
            response: pb.SessionResponse = next(self._call)
            return response
        except StopIteration:
            self._end(None)
        except grpc.RpcError as exc:
            self._end(exc)
        except BaseException:
            self.close()  # interrupted inside gRPC's read: leave no half-read call behind
            raise
        finally:
            self._holder = None
        return None

    def _end(self, error: grpc.RpcError | None) -> None:
        """The call ended; run once, by whoever read the end."""
        self.alive = False
        self._outbox.put(None)  # lets gRPC's request thread finish
        self._session._link_ended(self, error)
        with self._cond:
            self._ended = True
            self._cond.notify()

    def _pass_turn(self, holder: SessionStream | None) -> None:
        """After giving up the turn: every other waiting caller tries to take it, so that
        nobody waits on its queue while nobody reads."""
        with self._cond:
            for other in self._waiting:
                if other is not holder:
                    other._events.put(_POKE)

    def _read_idle(self) -> None:
        """The reader thread: reads while no caller does, and acts for a caller that is
        inside next() past its deadline or its cancel's grace."""
        seen, idle_since = -1, 0.0
        while True:
            epoch = self._epoch
            expecting, awaited = self._session._expecting(self)
            with self._cond:
                if self._ended:
                    return
                if self._epoch != epoch:
                    continue  # a message went out or a caller read meanwhile: look again
                now = time.monotonic()
                if epoch != seen or self._waiting:
                    seen, idle_since = epoch, now
                holder = self._holder  # one of _waiting: then this thread does not read
                due = holder._due() if holder is not None and self.alive else None
                read = not self._waiting and (
                    self._urgent or awaited or (expecting and now - idle_since >= IDLE_S)
                )
                if not read and (due is None or due > now):
                    timeout = IDLE_S - (now - idle_since) if expecting else math.inf
                    timeout = min(timeout, math.inf if due is None else due - now)
                    self._wake_at = now + timeout
                    self._cond.wait(None if timeout == math.inf else timeout)
                    continue
            if read:
                self._read_for_others()
            elif holder is not None and self._holder is holder:
                if holder.cancelled:
                    self.close()  # no response since the cancel: the server does not answer
                else:
                    holder._expire()

    def _read_for_others(self) -> None:
        """Route responses until a caller wants the turn or nothing more is expected."""
        if not self._turn.acquire(blocking=False):
            return  # a caller took it first
        try:
            while (response := self._next_response(None)) is not None:
                self._session._route(response)
                with self._cond:
                    if self._waiting:
                        return
                if not (self._session._expecting(self)[0] or self._urgent):
                    return
        finally:
            self._turn.release()
            self._pass_turn(None)


class Session(SessionCore[SessionStream]):
    """A completion session on one Session stream; make one with `Client.session()`.

    Thread-safe. The stream opens on the first completion and reopens after
    the server went away, so a long-lived session survives server restarts.
    """

    def _open_link(self) -> Link:
        return _ThreadLink(self, self._stub)

    def _expecting(self, link: Link) -> tuple[bool, bool]:
        """Whether completions on `link` still expect responses, and whether one of them
        is cancelled and expects the done that confirms it."""
        with self._lock:
            streams = [s for s in self._streams.values() if s.link is link]
        return bool(streams), any(s.cancelled for s in streams)

    def complete(
        self,
        prompt: str | None = None,
        *,
        prefix: str | None = None,
        suffix: str | None = None,
        timeout: float | None = None,
        **params: Unpack[CompletionParams],
    ) -> SessionStream:
        """Start a completion, superseding the one in flight; iterate the result for deltas."""
        request = build_request(prompt, prefix=prefix, suffix=suffix, **params)
        stream = SessionStream(self, request, self.options.deadline(timeout))
        self._begin(stream)
        return stream

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
