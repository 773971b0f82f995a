"""A session on the bidirectional `Session` RPC, for the asyncio client (what the LSP bridge uses)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from types import TracebackType
from typing import Any, TypeAlias, Unpack

import grpc

from nib.sdk.errors import status_lost_to_a_write
from nib.sdk.request import CompletionParams, build_request
from nib.sdk.session import deadline_passed
from nib.sdk.session_core import Link, SessionCore
from nib.sdk.state import StreamState
from nib.sdk.types import Completion
from nib.v1 import completion_pb2 as pb

_WAKE = object()
_Item: TypeAlias = pb.SessionResponse | grpc.RpcError | object | None


class AsyncSessionStream(StreamState):
    """One completion of an asyncio session; `async for` it like an AsyncCompletionStream.

    Ends with finish_reason `superseded` when a newer completion starts on the
    same session. Cancelling the iterating task cancels the completion on the
    server. After cancel(), `server_done` is set once the server confirmed the end.
    """

    def __init__(
        self, session: AsyncSession, request: pb.CompleteRequest, timeout: float | None
    ) -> None:
        super().__init__(request.request_id)
        self.request = request
        self.link: Link | None = None
        self.server_done = asyncio.Event()
        self._session = session
        self._events: asyncio.Queue[_Item] = asyncio.Queue()
        self._deadline = None if timeout is None else time.monotonic() + timeout

    def _remaining(self) -> float | None:
        return None if self._deadline is None else max(self._deadline - time.monotonic(), 0.0)

    def __aiter__(self) -> AsyncIterator[str]:
        self._check_iterable()
        return self._deltas()

    async def _deltas(self) -> AsyncIterator[str]:
        try:
            while not self.done:
                item = await self._next_event()
                if item is _WAKE:
                    return
                if isinstance(item, grpc.RpcError):
                    if self.cancelled:
                        return
                    await self._retry_or_raise(item)
                elif isinstance(item, pb.SessionResponse):
                    text = self._apply(item)
                    if text:
                        yield text
                else:
                    raise self._ended_without_done()
        finally:
            self.cancel()

    async def _next_event(self) -> _Item:
        remaining = self._remaining()
        if remaining is None:
            return await self._events.get()
        try:
            return await asyncio.wait_for(self._events.get(), remaining)
        except TimeoutError:
            raise deadline_passed() from None

    async def _retry_or_raise(self, exc: grpc.RpcError) -> None:
        retry = self._session.options.retry
        delay = self._backoff_or_raise(retry, exc, self._remaining())
        try:
            item = await asyncio.wait_for(self._events.get(), delay)  # cancel() cuts it short
        except TimeoutError:
            self.attempts += 1
            self._session._resend(self)
            return
        self._events.put_nowait(item)

    def _deliver(self, item: pb.SessionResponse | grpc.RpcError | None) -> None:
        if isinstance(item, pb.SessionResponse) and item.HasField("done"):
            if self.cancelled:
                self._record_done(item.done)
            self.server_done.set()
        self._events.put_nowait(item)

    def _wake(self) -> None:
        self._events.put_nowait(_WAKE)

    def cancel(self) -> None:
        """Stop the generation on the server; a no-op once the completion has ended."""
        if self._mark_cancelled():
            self._session._send_cancel(self)
            self._wake()

    close = cancel

    async def result(self) -> Completion:
        if not getattr(self, "_iterated", False):
            async for _ in self:
                pass
        if not self.done:
            raise RuntimeError("result() while another loop is still reading this stream")
        return self._result()

    async def __aenter__(self) -> AsyncSessionStream:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cancel()


class _TaskLink:
    """One Session call fed from an asyncio queue; a task routes the responses."""

    def __init__(self, session: AsyncSession, stub: Any) -> None:
        self.alive = True
        self._session = session
        self._outbox: asyncio.Queue[pb.SessionRequest | None] = asyncio.Queue()
        self._call = stub.Session(
            self._requests(), metadata=session.options.metadata(session.session_id) or None
        )
        self._reader = asyncio.get_running_loop().create_task(self._read())

    async def _requests(self) -> AsyncIterator[pb.SessionRequest]:
        while (message := await self._outbox.get()) is not None:
            yield message

    def send(self, message: pb.SessionRequest) -> None:
        self._outbox.put_nowait(message)

    async def _read(self) -> None:
        error: grpc.RpcError | None = None
        try:
            async for response in self._call:
                self._session._route(response)
        except grpc.RpcError as exc:
            error = status_lost_to_a_write(exc)
        except asyncio.CancelledError:
            if not self._call.cancelled():
                raise
        finally:
            self.alive = False
            self._outbox.put_nowait(None)
            self._session._link_ended(self, error)

    def close(self) -> None:
        self.alive = False
        self._call.cancel()
        self._outbox.put_nowait(None)

    async def wait_closed(self) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader


class AsyncSession(SessionCore[AsyncSessionStream]):
    """An asyncio completion session; make one with `AsyncClient.session()`.

    Use it from one event loop. The stream opens on the first completion and
    reopens after the server went away.
    """

    def _open_link(self) -> Link:
        return _TaskLink(self, self._stub)

    def complete(
        self,
        prompt: str | None = None,
        *,
        prefix: str | None = None,
        suffix: str | None = None,
        timeout: float | None = None,
        **params: Unpack[CompletionParams],
    ) -> AsyncSessionStream:
        """Start a completion, superseding the one in flight; `async for` the result."""
        request = build_request(prompt, prefix=prefix, suffix=suffix, **params)
        stream = AsyncSessionStream(self, request, self.options.deadline(timeout))
        self._begin(stream)
        return stream

    async def aclose(self) -> None:
        link = self._link
        self.close()
        if isinstance(link, _TaskLink):
            await link.wait_closed()

    async def __aenter__(self) -> AsyncSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
