"""A completion on the one-shot `Complete` RPC, for the synchronous client."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any

import grpc

from nib.sdk.retry import RetryPolicy
from nib.sdk.state import StreamState
from nib.sdk.types import Completion

# Starts the RPC with the given timeout (seconds, None for none) and returns the call.
StartCall = Callable[[float | None], Any]


class CompletionStream(StreamState):
    """Iterate for text deltas as they arrive; afterwards `text`, `finish_reason`,
    `usage` and `timings` describe the whole completion.

    The generation stops on the server when the caller breaks out of the
    loop, leaves a `with` block, or calls close() or cancel() (from any
    thread). An UNAVAILABLE server is retried with backoff until the first
    response arrives, never after.
    """

    def __init__(
        self, start: StartCall, request_id: str, retry: RetryPolicy, timeout: float | None
    ) -> None:
        super().__init__(request_id)
        self._start = start
        self._retry = retry
        self._deadline = None if timeout is None else time.monotonic() + timeout
        self._lock = threading.Lock()
        self._wake = threading.Event()  # set by cancel() to cut a backoff short
        self._call = start(self._remaining())

    def _remaining(self) -> float | None:
        return None if self._deadline is None else max(self._deadline - time.monotonic(), 0.0)

    def __iter__(self) -> Iterator[str]:
        self._check_iterable()
        return self._deltas()

    def _deltas(self) -> Iterator[str]:
        try:
            while not self.done:
                try:
                    for response in self._call:
                        text = self._apply(response)
                        if text:
                            yield text
                    if not self.done:
                        raise self._ended_without_done()
                except grpc.RpcError as exc:
                    if self.cancelled:
                        return
                    self._retry_or_raise(exc)
        finally:
            # Reached on break (the generator is closed), on errors and at the end.
            self.cancel()

    def _retry_or_raise(self, exc: grpc.RpcError) -> None:
        delay = self._backoff_or_raise(self._retry, exc, self._remaining())
        if self._wake.wait(delay):
            return  # cancelled while backing off
        with self._lock:
            if not self.cancelled:
                self.attempts += 1
                self._call = self._start(self._remaining())

    def cancel(self) -> None:
        """Stop the generation on the server (it stops within one decode step).

        Safe from any thread; does nothing once the completion has ended.
        """
        with self._lock:
            if self._mark_cancelled():
                self._call.cancel()
                self._wake.set()

    close = cancel

    def result(self) -> Completion:
        """Wait for the end (consuming the deltas not read yet) and return the completion."""
        if not getattr(self, "_iterated", False):
            for _ in self:
                pass
        if not self.done:
            raise RuntimeError("result() while another loop is still reading this stream")
        return self._result()

    def __enter__(self) -> CompletionStream:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cancel()
