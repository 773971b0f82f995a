"""A completion on the one-shot `Complete` RPC, for the asyncio client."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from types import TracebackType
from typing import Any

import grpc

from nib.sdk.retry import RetryPolicy
from nib.sdk.state import StreamState
from nib.sdk.types import Completion

StartCall = Callable[[float | None], Any]


def task_is_cancelling() -> bool:
    """Whether the running task itself is being cancelled (not just a call we cancelled)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


class AsyncCompletionStream(StreamState):
    """`async for` text deltas as they arrive; afterwards `text`, `finish_reason`,
    `usage` and `timings` describe the whole completion.

    The generation stops on the server when the caller leaves an `async with`
    block, calls close() or cancel(), breaks out of the loop (the loop's
    generator is closed by asyncio at the next turn of the event loop), or
    when the task that iterates is cancelled. UNAVAILABLE is retried with
    backoff until the first response arrives, never after.
    """

    def __init__(
        self, start: StartCall, request_id: str, retry: RetryPolicy, timeout: float | None
    ) -> None:
        super().__init__(request_id)
        self._start = start
        self._retry = retry
        self._deadline = None if timeout is None else time.monotonic() + timeout
        self._wake = asyncio.Event()  # set by cancel() to cut a backoff short
        self._call = start(self._remaining())

    def _remaining(self) -> float | None:
        return None if self._deadline is None else max(self._deadline - time.monotonic(), 0.0)

    def __aiter__(self) -> AsyncIterator[str]:
        self._check_iterable()
        return self._deltas()

    async def _deltas(self) -> AsyncIterator[str]:
        try:
            while not self.done:
                try:
                    async for response in self._call:
                        text = self._apply(response)
                        if text:
                            yield text
                    if not self.done:
                        raise self._ended_without_done()
                except asyncio.CancelledError:
                    # grpc.aio raises CancelledError from a call cancelled locally.
                    if self.cancelled and not task_is_cancelling():
                        return
                    raise
                except grpc.RpcError as exc:
                    if self.cancelled:
                        return
                    await self._retry_or_raise(exc)
        finally:
            self.cancel()

    async def _retry_or_raise(self, exc: grpc.RpcError) -> None:
        delay = self._backoff_or_raise(self._retry, exc, self._remaining())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), delay)
        if not self.cancelled:
            self.attempts += 1
            self._call = self._start(self._remaining())

    def cancel(self) -> None:
        """Stop the generation on the server (it stops within one decode step)."""
        if self._mark_cancelled():
            self._call.cancel()
            self._wake.set()

    close = cancel

    async def result(self) -> Completion:
        """Wait for the end (consuming the deltas not read yet) and return the completion."""
        if not getattr(self, "_iterated", False):
            async for _ in self:
                pass
        if not self.done:
            raise RuntimeError("result() while another loop is still reading this stream")
        return self._result()

    async def __aenter__(self) -> AsyncCompletionStream:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cancel()
