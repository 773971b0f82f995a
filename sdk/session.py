"""A session on the bidirectional `Session` RPC, for the synchronous client.

An editor starts a completion on every keystroke; on a session each new
start supersedes the one in flight (the server ends it with `superseded`),
and a cancel travels on the same stream, so nothing waits for a new call.
"""

from __future__ import annotations

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
_Item: TypeAlias = pb.SessionResponse | grpc.RpcError | object | None


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

    def _remaining(self) -> float | None:
        return None if self._deadline is None else max(self._deadline - time.monotonic(), 0.0)

    def __iter__(self) -> Iterator[str]:
        self._check_iterable()
        return self._deltas()

    def _deltas(self) -> Iterator[str]:
        try:
            while not self.done:
                try:
                    item = self._events.get(timeout=self._remaining())
                except queue.Empty:
                    raise deadline_passed() from None
                if item is _WAKE:
                    return
                if isinstance(item, grpc.RpcError):
                    if self.cancelled:
                        return
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
        delay = self._backoff_or_raise(retry, exc, self._remaining())
        try:
            item = self._events.get(timeout=delay)  # a cancel() cuts the backoff short
        except queue.Empty:
            self.attempts += 1
            self._session._resend(self)
            return
        self._events.put(item)

    def _deliver(self, item: pb.SessionResponse | grpc.RpcError | None) -> None:
        """From the reader thread: a response for this completion, or its link's end."""
        if isinstance(item, pb.SessionResponse) and item.HasField("done"):
            if self.cancelled:
                self._record_done(item.done)
            self.server_done.set()
        self._events.put(item)

    def _wake(self) -> None:
        self._events.put(_WAKE)

    def cancel(self) -> None:
        """Stop the generation on the server; safe from any thread; no-op once ended."""
        if self._mark_cancelled():
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
    """One Session call: gRPC's own thread reads `outbox`, a reader thread routes responses."""

    def __init__(self, session: Session, stub: Any) -> None:
        self.alive = True
        self._session = session
        self._outbox: queue.Queue[pb.SessionRequest | None] = queue.Queue()
        self._call = stub.Session(
            iter(self._outbox.get, None),
            metadata=session.options.metadata(session.session_id) or None,
        )
        threading.Thread(target=self._read, name="nib-session-reader", daemon=True).start()

    def send(self, message: pb.SessionRequest) -> None:
        self._outbox.put(message)

    def _read(self) -> None:
        error: grpc.RpcError | None = None
        try:
            for response in self._call:
                self._session._route(response)
        except grpc.RpcError as exc:
            error = exc
        finally:
            self.alive = False
            self._outbox.put(None)  # lets gRPC's request thread finish
            self._session._link_ended(self, error)

    def close(self) -> None:
        self.alive = False
        self._call.cancel()
        self._outbox.put(None)


class Session(SessionCore[SessionStream]):
    """A completion session on one Session stream; make one with `Client.session()`.

    Thread-safe. The stream opens on the first completion and reopens after
    the server went away, so a long-lived session survives server restarts.
    """

    def _open_link(self) -> Link:
        return _ThreadLink(self, self._stub)

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
