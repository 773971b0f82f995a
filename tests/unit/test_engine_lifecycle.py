"""Engine lifecycle: every request gets exactly one DoneEvent, even when the thread dies;
queued requests can be withdrawn; hooks report state; stats count."""

from __future__ import annotations

import queue
import threading
import time
from pathlib import Path

import pytest

from nib.engine.engine import Engine, EngineConfig
from nib.engine.errors import EngineUnavailable, QueueFull
from nib.engine.hooks import EngineHooks, EngineState
from nib.engine.request import DoneEvent, Event, FinishReason, GenerationParams


class Crash(BaseException):
    pass


def collect(events: queue.Queue[Event], timeout: float = 30) -> tuple[int, DoneEvent]:
    tokens = 0
    while not isinstance(ev := events.get(timeout=timeout), DoneEvent):
        tokens += 1
    return tokens, ev


def test_thread_death_ends_running_and_queued_requests(random_model_dir: Path) -> None:
    states: list[EngineState] = []
    gate = threading.Event()

    def before_step(request_id: str, generated: int) -> None:
        if request_id == "a" and generated == 3:
            gate.wait(10)  # hold the engine here until "b" is queued
            raise Crash("boom")

    engine = Engine(
        EngineConfig(model_dir=random_model_dir, max_context=128),
        EngineHooks(on_state=states.append, before_step=before_step),
    ).start()
    assert engine.wait_ready(60)
    a: queue.Queue[Event] = queue.Queue()
    b: queue.Queue[Event] = queue.Queue()
    engine.submit([1, 2], GenerationParams(max_tokens=50), a.put, "a")
    engine.submit([1, 2], GenerationParams(max_tokens=50), b.put, "b")
    gate.set()
    tokens_a, done_a = collect(a)
    _, done_b = collect(b)
    assert tokens_a == 3
    for done in (done_a, done_b):
        assert done.finish_reason is FinishReason.ERROR
        assert isinstance(done.cause, EngineUnavailable)
        assert "engine thread died" in done.error and "boom" in done.error
    engine._thread.join(10)
    assert not engine.alive and isinstance(engine.failure, Crash)
    assert states == [EngineState.READY, EngineState.FAILED]
    with pytest.raises(EngineUnavailable, match="engine failed"):
        engine.submit([1], GenerationParams(max_tokens=1), a.put, "c")


def test_request_error_fails_one_request_and_engine_goes_on(random_model_dir: Path) -> None:
    def before_step(request_id: str, generated: int) -> None:
        if request_id == "bad" and generated == 2:
            raise RuntimeError("kernel fault")

    engine = Engine(
        EngineConfig(model_dir=random_model_dir, max_context=128),
        EngineHooks(before_step=before_step),
    ).start()
    try:
        assert engine.wait_ready(60)
        bad: queue.Queue[Event] = queue.Queue()
        engine.submit([1], GenerationParams(max_tokens=20), bad.put, "bad")
        _, done = collect(bad)
        assert done.finish_reason is FinishReason.ERROR and done.cause is None
        assert "kernel fault" in done.error
        good: queue.Queue[Event] = queue.Queue()
        engine.submit([1], GenerationParams(max_tokens=5), good.put, "good")
        tokens, done = collect(good)
        assert done.finish_reason is FinishReason.LENGTH and tokens == 5
        assert engine.stats.requests == 2
        assert engine.stats.generated_tokens == 2 + 5
        assert engine.stats.prompt_tokens == 2
    finally:
        engine.stop()


def test_withdrawn_request_frees_its_queue_slot(random_model_dir: Path) -> None:
    engine = Engine(EngineConfig(model_dir=random_model_dir, max_context=64, max_queue=1))
    # Not started: nothing takes requests off the queue.
    engine._thread = threading.Thread(target=lambda: threading.Event().wait(5), daemon=True)
    engine._thread.start()
    first = engine.submit([1], GenerationParams(max_tokens=1), lambda e: None, "a")
    assert engine.queue_depth == 1
    with pytest.raises(QueueFull, match="the queue holds at most 1"):
        engine.submit([1], GenerationParams(max_tokens=1), lambda e: None, "b")
    assert first.withdraw(FinishReason.SUPERSEDED) is True
    assert first.cancelled and first.reason is FinishReason.SUPERSEDED
    assert engine.queue_depth == 0
    assert first.claim() is False  # the engine would skip it
    second = engine.submit([1], GenerationParams(max_tokens=1), lambda e: None, "c")
    assert second.claim() is True and second.withdraw() is False
    assert engine.queue_depth == 0


def test_stop_ends_queued_requests_and_reports_stopped(random_model_dir: Path) -> None:
    states: list[EngineState] = []
    hold = threading.Event()
    engine = Engine(
        EngineConfig(model_dir=random_model_dir, max_context=128),
        EngineHooks(on_state=states.append, before_step=lambda rid, n: hold.wait(10)),
    ).start()
    assert engine.wait_ready(60)
    running: queue.Queue[Event] = queue.Queue()
    waiting: queue.Queue[Event] = queue.Queue()
    handle = engine.submit([1], GenerationParams(max_tokens=50), running.put, "r")
    engine.submit([1], GenerationParams(max_tokens=50), waiting.put, "w")
    running.get(timeout=30)  # the first token: "r" runs, "w" waits
    handle.cancel()
    stopper = threading.Thread(target=engine.stop)
    stopper.start()
    hold.set()
    _, done_r = collect(running)
    _, done_w = collect(waiting)
    stopper.join(30)
    assert done_r.finish_reason is FinishReason.CANCELLED
    # "w" was queued before the stop sentinel, so it still ran or was ended; never lost.
    assert done_w.finish_reason in (FinishReason.LENGTH, FinishReason.ERROR)
    assert states == [EngineState.READY, EngineState.STOPPED]
    with pytest.raises(EngineUnavailable, match="stopping"):
        engine.submit([1], GenerationParams(max_tokens=1), waiting.put, "late")


def test_graph_fallbacks_are_counted_per_graph() -> None:
    from nib.engine.stats import EngineStats

    stats = EngineStats()
    stats.record_graph_fallback("decode")
    stats.record_graph_fallback("decode")
    stats.record_graph_fallback("prefill-512")
    assert stats.graph_fallback_counts() == {"decode": 2, "prefill-512": 1}


def test_wait_ready_returns_at_once_when_start_up_fails(random_model_dir: Path) -> None:
    """A failed start ends the wait (benches and tools wait with long timeouts)."""
    import time

    def before_ready() -> None:
        raise Crash("start-up broke")

    engine = Engine(
        EngineConfig(model_dir=random_model_dir, max_context=128),
        EngineHooks(before_ready=before_ready),
    ).start()
    started = time.perf_counter()
    assert engine.wait_ready(120) is False
    assert time.perf_counter() - started < 60
    assert isinstance(engine.failure, Crash)
    engine.stop()


def voluntary_switches(thread: threading.Thread) -> int:
    """How often the thread has blocked so far (Linux: its /proc status)."""
    status = Path(f"/proc/self/task/{thread.native_id}/status")
    if not status.is_file():
        pytest.skip("needs Linux /proc to count a thread's wake-ups")
    for line in status.read_text().splitlines():
        if line.startswith("voluntary_ctxt_switches:"):
            return int(line.split()[1])
    pytest.skip("this kernel does not count context switches")


def test_idle_engine_sleeps_until_a_request_comes(random_model_dir: Path) -> None:
    """Between requests the engine thread blocks until submit() wakes it: no poll, sleep
    or wait with a timeout, each of which would add its interval to a request's time to
    first token. A thread that never wakes up by itself has no count of wake-ups to show."""
    engine = Engine(EngineConfig(model_dir=random_model_dir, max_context=128)).start()
    assert engine.wait_ready(60)
    events: queue.Queue[Event] = queue.Queue()
    engine.submit([1, 2], GenerationParams(max_tokens=2), events.put, "warm")
    collect(events)
    time.sleep(0.2)  # the engine is back in its wait
    before = voluntary_switches(engine._thread)
    time.sleep(1.0)
    woke = voluntary_switches(engine._thread) - before
    engine.submit([1, 2], GenerationParams(max_tokens=2), events.put, "after")
    tokens, done = collect(events)
    engine.stop()
    assert woke <= 1, f"the idle engine thread woke {woke} times in 1 s"
    assert tokens == 2 and done.finish_reason is FinishReason.LENGTH
