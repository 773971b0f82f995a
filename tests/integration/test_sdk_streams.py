"""SDK streams against the real server: cancellation the server sees, sessions, results.

The proof that a cancel reached the slow_server: a generation of 1000 tokens takes
well over a minute on the test model, and the engine runs one request at a
time, so the next request would queue behind it. After a cancel it must start
within a few decode steps.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import pytest

from nib.sdk import (
    AsyncClient,
    AsyncCompletionStream,
    Client,
    CompletionStream,
    DeadlineExceeded,
    FinishReason,
    InvalidArgument,
)

from .conftest import (
    ServerProcess,
    assert_cancelled_on_server,
    assert_engine_free,
    assert_engine_free_async,
)

LONG = {"max_tokens": 1000, "temperature": 1.0, "seed": 1}


def read_three_then(stream: CompletionStream, how: str) -> None:
    if how == "break":
        for i, _ in enumerate(stream):
            if i == 2:
                break
    elif how == "with":
        with stream:
            it = iter(stream)
            for _ in range(3):
                next(it)
    else:
        it = iter(stream)
        for _ in range(3):
            next(it)
        getattr(stream, how)()  # close() or cancel()


@pytest.mark.parametrize("how", ["break", "close", "cancel", "with"])
def test_sync_stream_cancel_reaches_the_server(slow_server: ServerProcess, how: str) -> None:
    with Client(slow_server.address) as client:
        stream = client.complete("x", **LONG)
        read_three_then(stream, how)
        assert stream.finish_reason == FinishReason.CANCELLED and stream.cancelled
        assert 3 <= len(stream.token_ids) < 50
        assert_engine_free(client)
    assert_cancelled_on_server(slow_server, stream.request_id, "client_gone")


def test_cancel_from_another_thread_ends_the_loop(slow_server: ServerProcess) -> None:
    with Client(slow_server.address) as client:
        stream = client.complete("x", **LONG)
        seen = []
        for text in stream:
            seen.append(text)
            if len(seen) == 2:
                threading.Thread(target=stream.cancel).start()
        assert stream.finish_reason == "cancelled" and len(seen) < 50
        assert_engine_free(client)


async def read_three_then_async(stream: AsyncCompletionStream, how: str) -> None:
    if how == "break":
        n = 0
        async for _ in stream:
            n += 1
            if n == 3:
                break
        # asyncio closes the abandoned loop's generator within a few turns of the event loop.
        for _ in range(10):
            if stream.done:
                break
            await asyncio.sleep(0)
    elif how == "async with":
        async with stream:
            it = aiter(stream)
            for _ in range(3):
                await anext(it)
    elif how == "task cancelled":

        async def consume() -> None:
            async for _ in stream:
                pass

        task = asyncio.create_task(consume())
        for _ in range(6000):  # poll: the stream has no event to wait on for "3 tokens"
            if len(stream.token_ids) >= 3:
                break
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    else:
        it = aiter(stream)
        for _ in range(3):
            await anext(it)
        getattr(stream, how)()


@pytest.mark.parametrize("how", ["break", "close", "cancel", "async with", "task cancelled"])
async def test_async_stream_cancel_reaches_the_server(slow_server: ServerProcess, how: str) -> None:
    async with AsyncClient(slow_server.address) as client:
        stream = client.complete("x", **LONG)
        await read_three_then_async(stream, how)
        assert stream.finish_reason == "cancelled"
        assert 3 <= len(stream.token_ids) < 50
        await assert_engine_free_async(client)
    assert_cancelled_on_server(slow_server, stream.request_id, "client_gone")


def test_result_and_stream_agree(slow_server: ServerProcess) -> None:
    with Client(slow_server.address) as client:
        sent = time.time() * 1e3
        streamed = client.complete("def f(x):", max_tokens=12, temperature=0.7, seed=5)
        text = "".join(streamed)
        received = time.time() * 1e3
        # Same host, same clock: the server's arrival stamp falls inside the call.
        assert sent - 1 <= streamed.timings.arrival_unix_ms <= received + 1
        result = client.complete("def f(x):", max_tokens=12, temperature=0.7, seed=5).result()
    assert result.text == text == streamed.text  # same seed, same tokens
    assert result.finish_reason in ("length", "end_of_text")
    assert result.usage.completion_tokens == len(result.token_ids) <= 12
    assert result.timings.ttft_ms > 0 and result.timings.total_ms >= result.timings.ttft_ms
    with pytest.raises(RuntimeError, match="only once"):
        list(streamed)


def test_fill_in_the_middle_uses_the_models_template(slow_server: ServerProcess) -> None:
    prefix, suffix = "def add(a, b):\n    ", "\n\nprint(add(1, 2))\n"
    with Client(slow_server.address) as client:
        result = client.complete(prefix=prefix, suffix=suffix, max_tokens=4).result()
    # Byte-level tokenizer: one token per byte, plus <|fim_prefix|> <|fim_suffix|> <|fim_middle|>.
    assert result.usage.prompt_tokens == len(prefix) + len(suffix) + 3


def test_session_supersedes_and_cancels(slow_server: ServerProcess) -> None:
    with Client(slow_server.address) as client, client.session() as session:
        first = session.complete("a", **LONG)
        it = iter(first)
        for _ in range(3):
            next(it)
        second = session.complete("b", max_tokens=5)
        assert list(it) is not None  # the rest of the first one, until its end
        assert first.finish_reason == FinishReason.SUPERSEDED
        assert first.usage.completion_tokens < 50
        result = second.result()
        assert result.finish_reason in ("length", "end_of_text")
        assert result.usage.completion_tokens == 5 or result.finish_reason == "end_of_text"
        # An explicit cancel: the server confirms it with its own done.
        third = session.complete("c", **LONG)
        it = iter(third)
        next(it)
        third.cancel()
        assert third.server_done.wait(10), "the server never confirmed the cancel"
        assert third.finish_reason == "cancelled" and 1 <= third.usage.completion_tokens < 50
        assert_engine_free(client)
    assert_cancelled_on_server(slow_server, first.request_id, "superseded")
    assert_cancelled_on_server(slow_server, third.request_id, "request")


def test_session_reports_a_bad_start_and_lives_on(slow_server: ServerProcess) -> None:
    with Client(slow_server.address) as client, client.session() as session:
        with pytest.raises(InvalidArgument, match="max_tokens: is 5000; must be at most 1024"):
            session.complete("x", max_tokens=5000).result()
        assert session.complete("x", max_tokens=3).result().usage.completion_tokens <= 3


def test_session_deadline_cancels_on_the_server(slow_server: ServerProcess) -> None:
    with Client(slow_server.address) as client, client.session() as session:
        stream = session.complete("x", timeout=1.0, **LONG)
        with pytest.raises(DeadlineExceeded):
            stream.result()
        assert stream.server_done.wait(10)
        assert_engine_free(client)
    # 1 s deadline: stopped well before the 1,000 tokens, and soon after the deadline.
    assert_cancelled_on_server(slow_server, stream.request_id, "request", within_ms=1500)


def test_complete_deadline_stops_the_generation(slow_server: ServerProcess) -> None:
    with Client(slow_server.address) as client:
        stream = client.complete("x", timeout=1.0, **LONG)
        with pytest.raises(DeadlineExceeded):
            stream.result()
        assert_engine_free(client)
    assert_cancelled_on_server(
        slow_server, stream.request_id, "deadline", "client_gone", within_ms=1500
    )


async def test_async_session_supersedes_and_cancels(slow_server: ServerProcess) -> None:
    async with AsyncClient(slow_server.address) as client, client.session() as session:
        first = session.complete("a", **LONG)
        second = None
        async for _ in first:
            if second is None and len(first.token_ids) >= 3:
                second = session.complete("b", max_tokens=5)
        assert second is not None
        assert first.finish_reason == "superseded" and first.usage.completion_tokens < 50
        assert (await second.result()).finish_reason in ("length", "end_of_text")
        third = session.complete("c", **LONG)
        async for _ in third:
            break
        await asyncio.sleep(0)
        await asyncio.wait_for(third.server_done.wait(), 10)
        assert third.finish_reason == "cancelled" and third.usage.completion_tokens < 50
        await assert_engine_free_async(client)
    assert_cancelled_on_server(slow_server, first.request_id, "superseded")
    assert_cancelled_on_server(slow_server, third.request_id, "request")


def test_one_client_shared_by_threads(slow_server: ServerProcess) -> None:
    results: dict[int, list[str]] = {}
    errors: list[BaseException] = []

    def work(n: int, client: Client) -> Callable[[], None]:
        def run() -> None:
            try:
                results[n] = [
                    str(client.complete(f"t{n}", max_tokens=3).result().finish_reason)
                    for _ in range(2)
                ]
            except BaseException as exc:
                errors.append(exc)

        return run

    with Client(slow_server.address) as client:
        threads = [threading.Thread(target=work(n, client)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    assert not errors, errors
    assert sorted(results) == [0, 1, 2, 3]
    assert all(r in ("length", "end_of_text") for rs in results.values() for r in rs)
