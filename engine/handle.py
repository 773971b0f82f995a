"""A submitted request's handle: cancel it, or withdraw it before it starts."""

from __future__ import annotations

import threading
from collections.abc import Callable

from nib.engine.request import FinishReason


class Handle:
    """Lets the submitter cancel its request; safe to call from any thread.

    A request waits in the queue until the engine claims it (to run or to fail
    it) or its submitter withdraws it. Exactly one of the two succeeds, so
    exactly one side sends the request's DoneEvent.
    """

    def __init__(self, request_id: str, on_leave_queue: Callable[[], None] | None = None) -> None:
        self.request_id = request_id
        self._event = threading.Event()
        self.reason = FinishReason.CANCELLED
        self._lock = threading.Lock()
        self._queued = True
        self._on_leave_queue = on_leave_queue

    def cancel(self, reason: FinishReason = FinishReason.CANCELLED) -> None:
        if not self._event.is_set():
            self.reason = reason
            self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def withdraw(self, reason: FinishReason = FinishReason.CANCELLED) -> bool:
        """Cancel; True if the engine had not claimed the request yet, in which
        case the engine will send it nothing and the caller ends it itself."""
        self.cancel(reason)
        return self._leave_queue()

    def claim(self) -> bool:
        """The engine takes the request; False if it was withdrawn."""
        return self._leave_queue()

    def _leave_queue(self) -> bool:
        with self._lock:
            if not self._queued:
                return False
            self._queued = False
        if self._on_leave_queue is not None:
            self._on_leave_queue()
        return True
