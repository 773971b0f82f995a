"""The asyncio side of the engine: submit a request, iterate its events."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from nib.engine.engine import Engine
from nib.engine.handle import Handle
from nib.engine.request import DoneEvent, Event, FinishReason, GenerationParams, Timings, Usage


class Completion:
    """Events of one request as an async iterator; ends after its DoneEvent.

    Leaving the iteration early (break, exception, task cancellation) should be
    followed by cancel(); `async with` does that. Call cancel() from the event
    loop's thread. A request cancelled while still queued ends at once (the
    engine skips it), not when the engine reaches it.
    """

    def __init__(
        self,
        engine: Engine,
        prompt_ids: list[int],
        params: GenerationParams,
        request_id: str,
        session: str = "",
    ) -> None:
        loop = asyncio.get_running_loop()
        self._events: asyncio.Queue[Event] = asyncio.Queue()

        def sink(event: Event) -> None:  # called on the engine thread
            if loop.is_closed():
                raise RuntimeError("event loop closed")
            loop.call_soon_threadsafe(self._events.put_nowait, event)

        self.request_id = request_id
        self.prompt_tokens = len(prompt_ids)
        self._submitted = time.perf_counter()
        self.handle: Handle = engine.submit(prompt_ids, params, sink, request_id, session)
        self.done: DoneEvent | None = None

    def cancel(self, reason: FinishReason = FinishReason.CANCELLED) -> None:
        if self.handle.withdraw(reason):
            waited_ms = (time.perf_counter() - self._submitted) * 1e3
            self._events.put_nowait(
                DoneEvent(
                    reason,
                    Usage(prompt_tokens=self.prompt_tokens),
                    Timings(queue_ms=waited_ms, total_ms=waited_ms),
                )
            )

    async def __aenter__(self) -> Completion:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.done is None:
            self.cancel()

    def __aiter__(self) -> AsyncIterator[Event]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Event]:
        while self.done is None:
            event = await self._events.get()
            if isinstance(event, DoneEvent):
                self.done = event
            yield event
