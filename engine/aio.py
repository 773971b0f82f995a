"""The asyncio side of the engine: submit a request, iterate its events."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import TypeVar

from nib.engine.engine import Engine
from nib.engine.handle import Handle
from nib.engine.request import (
    DoneEvent,
    Event,
    FinishReason,
    GenerationParams,
    Timings,
    TokenEvent,
    Usage,
    unix_ms,
)

T = TypeVar("T")


def coalesce(
    first: T,
    queue: asyncio.Queue[T],
    joinable: Callable[[T, T], bool],
    join: Callable[[list[T]], T],
) -> tuple[T, T | None]:
    """`first` joined with the items already waiting behind it that `joinable(first,
    item)` accepts, and the first item it did not accept (taken off the queue: the
    caller hands it out next), or None.

    A consumer that falls behind its producer (a busy event loop, a client reading
    slowly) then sends fewer, larger messages instead of a growing backlog of one-token
    ones; it never waits for more: what has not arrived yet is not waited for, so the
    first token of a completion goes out alone, as soon as it exists."""
    if queue.empty():  # the usual case, once per token: no exception raised for it
        return first, None
    parts, held = [first], None
    while not queue.empty():
        item = queue.get_nowait()
        if not joinable(first, item):
            held = item
            break
        parts.append(item)
    return (first if len(parts) == 1 else join(parts)), held


def join_tokens(events: list[TokenEvent]) -> TokenEvent:
    """Consecutive TokenEvents of one completion as one (their text and ids in order)."""
    return TokenEvent(
        "".join(e.text for e in events),
        tuple(t for e in events for t in e.token_ids),
        tuple(p for e in events for p in e.logprobs),
    )


def _both_tokens(first: Event, item: Event) -> bool:
    return isinstance(item, TokenEvent)


class Completion:
    """Events of one request as an async iterator; ends after its DoneEvent.

    Tokens that are already waiting when the consumer asks for the next event come
    as one TokenEvent (coalesce()): a consumer that falls behind catches up in fewer
    messages, and none waits for company.

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
                    Timings(
                        queue_ms=waited_ms,
                        total_ms=waited_ms,
                        arrival_unix_ms=unix_ms(self._submitted),
                    ),
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
        held: Event | None = None
        while self.done is None:
            event = held if held is not None else await self._events.get()
            held = None
            if isinstance(event, TokenEvent):  # with the tokens that queued behind it
                event, held = coalesce(event, self._events, _both_tokens, join_tokens)  # type: ignore[arg-type]
            if isinstance(event, DoneEvent):
                self.done = event
            yield event
