"""Tokens that queue up behind a slow consumer go out joined, and the first never waits
(engine/aio.py coalesce(), Completion, and the Session stream's next_out())."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from nib.engine.aio import Completion, coalesce, join_tokens
from nib.engine.request import DoneEvent, Event, FinishReason, GenerationParams, TokenEvent
from nib.service.session import End, SessionStream
from nib.v1 import completion_pb2 as pb


class _Handle:
    def withdraw(self, reason: FinishReason) -> bool:
        return False


class _Engine:
    """Hands the sink to the test, which plays the engine thread."""

    sink: Callable[[Event], None]

    def submit(self, prompt_ids: list[int], params: Any, sink: Any, rid: str, session: str) -> Any:
        self.sink = sink
        return _Handle()


def _tok(i: int, logprob: float | None = None) -> TokenEvent:
    return TokenEvent(f"<{i}>", (i,), () if logprob is None else (logprob,))


async def test_coalesce_joins_what_waits_and_hands_back_the_first_it_cannot_join() -> None:
    q: asyncio.Queue[str] = asyncio.Queue()
    for item in ("b", "c", "STOP", "d"):
        q.put_nowait(item)
    joined, held = coalesce("a", q, lambda first, item: item.islower(), "".join)
    assert (joined, held) == ("abc", "STOP")
    assert q.get_nowait() == "d" and q.empty()


async def test_coalesce_with_nothing_waiting_returns_the_item_itself() -> None:
    q: asyncio.Queue[list[int]] = asyncio.Queue()
    first = [1]
    joined, held = coalesce(
        first, q, lambda a, b: True, lambda parts: [x for p in parts for x in p]
    )
    assert joined is first and held is None


def test_join_tokens_keeps_order_and_logprob_alignment() -> None:
    joined = join_tokens([_tok(1, -0.5), _tok(2, -1.0), TokenEvent("", (3,), (-2.0,))])
    assert joined == TokenEvent("<1><2>", (1, 2, 3), (-0.5, -1.0, -2.0))


async def test_a_consumer_that_fell_behind_gets_the_waiting_tokens_as_one_event() -> None:
    engine = _Engine()
    completion = Completion(engine, [1, 2], GenerationParams(), "r")  # type: ignore[arg-type]
    for i in range(1, 5):
        engine.sink(_tok(i, -float(i)))
    engine.sink(DoneEvent(FinishReason.LENGTH))
    await asyncio.sleep(0)  # the engine thread's call_soon_threadsafe callbacks run
    events = [e async for e in completion]
    assert events[0] == TokenEvent("<1><2><3><4>", (1, 2, 3, 4), (-1.0, -2.0, -3.0, -4.0))
    assert isinstance(events[1], DoneEvent) and len(events) == 2
    assert completion.done is events[1]


async def test_the_first_token_goes_out_alone_without_waiting_for_more() -> None:
    engine = _Engine()
    completion = Completion(engine, [1], GenerationParams(), "r")  # type: ignore[arg-type]
    stream = aiter(completion)
    engine.sink(_tok(1))
    first = await asyncio.wait_for(anext(stream), 5)  # nothing else is coming yet
    assert first == _tok(1)
    engine.sink(_tok(2))
    engine.sink(_tok(3))
    engine.sink(DoneEvent(FinishReason.LENGTH))
    await asyncio.sleep(0)
    assert await anext(stream) == TokenEvent("<2><3>", (2, 3))
    assert isinstance(await anext(stream), DoneEvent)


def _delta(rid: str, i: int) -> pb.SessionResponse:
    return pb.SessionResponse(request_id=rid, delta=pb.Delta(text=f"<{i}>", token_ids=[i]))


async def test_a_session_joins_waiting_deltas_of_one_completion_only() -> None:
    stream = SessionStream.__new__(SessionStream)  # next_out reads only the queue
    stream.out = asyncio.Queue()
    stream._held = None
    done_a = pb.SessionResponse(request_id="a", done=pb.Done())
    for item in (_delta("a", 1), _delta("a", 2), _delta("a", 3), _delta("b", 4), done_a, End.OK):
        stream.out.put_nowait(item)
    first = await stream.next_out()
    assert isinstance(first, pb.SessionResponse) and first.request_id == "a"
    assert first.delta.text == "<1><2><3>" and list(first.delta.token_ids) == [1, 2, 3]
    second = await stream.next_out()
    assert isinstance(second, pb.SessionResponse)
    assert (second.request_id, list(second.delta.token_ids)) == ("b", [4])
    assert await stream.next_out() == done_a
    assert await stream.next_out() is End.OK
