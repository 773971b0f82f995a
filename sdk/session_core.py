"""The bookkeeping a session shares between the sync and the asyncio client.

A session owns at most one open Session call (a "link"). Completions are
routed by request_id; when the link ends, every completion still waiting on
it hears why, and the next start opens a fresh link. Nothing here blocks, so
a plain lock serves both the threaded and the asyncio session.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any, Generic, Protocol, TypeVar

import grpc

from nib.sdk.connection import ConnectionOptions
from nib.sdk.types import FinishReason
from nib.v1 import completion_pb2 as pb


class Link(Protocol):
    alive: bool

    def send(self, message: pb.SessionRequest) -> None: ...

    def close(self) -> None: ...


class RoutedStream(Protocol):
    request_id: str
    request: pb.CompleteRequest
    cancelled: bool
    finish_reason: FinishReason | None
    link: Link | None

    def _deliver(self, item: pb.SessionResponse | grpc.RpcError | None) -> None: ...

    def _wake(self) -> None: ...

    def cancel(self) -> None: ...


S = TypeVar("S", bound=RoutedStream)


class SessionCore(Generic[S]):
    def __init__(
        self, stub: Any, options: ConnectionOptions, session_id: str | None = None
    ) -> None:
        self.options = options
        # Sent on every stream this session opens (reconnects too): the server keeps the
        # session's prompt prefix cached, and a load balancer keeps it on one replica.
        self.session_id = session_id or uuid.uuid4().hex
        self._stub = stub
        self._lock = threading.RLock()
        self._link: Link | None = None
        self._streams: dict[str, S] = {}
        self._latest: S | None = None
        self._closed = False

    def _open_link(self) -> Link:
        raise NotImplementedError

    def _begin(self, stream: S) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError("the session is closed")
            self._streams[stream.request_id] = stream
            self._latest = stream
            self._start(stream)

    def _start(self, stream: S) -> None:
        if self._link is None or not self._link.alive:
            self._link = self._open_link()
        stream.link = self._link
        self._link.send(pb.SessionRequest(start=stream.request))

    def _resend(self, stream: S) -> None:
        """Retry a start whose link failed before anything arrived."""
        with self._lock:
            if self._closed or stream.cancelled:
                return
            if self._latest is not stream:
                # A newer completion took over while this one waited to retry.
                stream.finish_reason = FinishReason.SUPERSEDED
                stream._wake()
                return
            self._streams[stream.request_id] = stream
            self._start(stream)

    def _send_cancel(self, stream: S) -> None:
        with self._lock:
            link = stream.link
            if link is not None and link.alive:
                # It stays routed until the server's done (with its usage) arrives.
                link.send(pb.SessionRequest(cancel=pb.Cancel(request_id=stream.request_id)))
            else:
                self._streams.pop(stream.request_id, None)

    def _take(self, response: pb.SessionResponse) -> S | None:
        """The completion a response is for (None: none waits for it); a done unroutes it."""
        with self._lock:
            stream = self._streams.get(response.request_id)
            if stream is not None and response.HasField("done"):
                del self._streams[response.request_id]
        return stream

    def _route(self, response: pb.SessionResponse) -> None:
        stream = self._take(response)
        if stream is not None:
            stream._deliver(response)

    def _link_ended(self, link: Link, error: grpc.RpcError | None) -> None:
        with self._lock:
            if self._link is link:
                self._link = None
            orphans = [s for s in self._streams.values() if s.link is link]
            for stream in orphans:
                del self._streams[stream.request_id]
        for stream in orphans:
            stream._deliver(error)

    def cancel(self, request_id: str | None = None) -> None:
        """Cancel one completion of this session, by default the latest."""
        with self._lock:
            stream = self._latest if request_id is None else self._streams.get(request_id)
        if stream is not None:
            stream.cancel()

    def close(self) -> None:
        """Cancel what runs and end the stream; the session cannot be used afterwards."""
        with self._lock:
            self._closed = True
            streams = list(self._streams.values())
            link, self._link = self._link, None
        for stream in streams:
            stream.cancel()
        if link is not None:
            link.close()
