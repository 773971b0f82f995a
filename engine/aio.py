"""The asyncio side of the engine: submit a request, iterate its events."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from nib.engine.engine import Engine, Handle
from nib.engine.request import DoneEvent, Event, FinishReason, GenerationParams


class Completion:
    """Events of one request as an async iterator; ends after its DoneEvent.

    Leaving the iteration early (break, exception, task cancellation) should be
    followed by cancel(); `async with` does that.
    """

    def __init__(
        self, engine: Engine, prompt_ids: list[int], params: GenerationParams, request_id: str
    ) -> None:
        loop = asyncio.get_running_loop()
        self._events: asyncio.Queue[Event] = asyncio.Queue()

        def sink(event: Event) -> None:  # called on the engine thread
            if loop.is_closed():
                raise RuntimeError("event loop closed")
            loop.call_soon_threadsafe(self._events.put_nowait, event)

        self.request_id = request_id
        self.handle: Handle = engine.submit(prompt_ids, params, sink, request_id)
        self.done: DoneEvent | None = None

    def cancel(self, reason: FinishReason = FinishReason.CANCELLED) -> None:
        self.handle.cancel(reason)

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
