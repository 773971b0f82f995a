"""The engine thread: streams tokens, honours stop strings, cancels between steps."""

from __future__ import annotations

import queue
import threading
import time
from pathlib import Path

import pytest

from nib.engine.engine import Engine, EngineConfig
from nib.engine.errors import InvalidRequest, QueueFull
from nib.engine.request import DoneEvent, Event, FinishReason, GenerationParams, Prompt, TokenEvent


@pytest.fixture(scope="module")
def engine(random_model_dir: Path):
    eng = Engine(EngineConfig(model_dir=random_model_dir, max_context=256, max_queue=4)).start()
    assert eng.wait_ready(60)
    yield eng
    eng.stop()


def run(
    engine: Engine, prompt: str, params: GenerationParams
) -> tuple[list[TokenEvent], DoneEvent]:
    events: queue.Queue[Event] = queue.Queue()
    engine.submit(engine.encode_prompt(Prompt(text=prompt)), params, events.put, "t")
    tokens: list[TokenEvent] = []
    while not isinstance(ev := events.get(timeout=30), DoneEvent):
        tokens.append(ev)
    return tokens, ev


def test_greedy_is_deterministic_and_counts_tokens(engine: Engine) -> None:
    a, done = run(engine, "def main():", GenerationParams(max_tokens=20))
    b, _ = run(engine, "def main():", GenerationParams(max_tokens=20))
    assert [t.token_ids for t in a] == [t.token_ids for t in b]
    assert done.finish_reason in (FinishReason.LENGTH, FinishReason.END_OF_TEXT)
    assert done.usage.completion_tokens == sum(len(t.token_ids) for t in a)
    assert done.usage.prompt_tokens == len("def main():")  # byte-level tokenizer
    assert done.timings.ttft_ms > 0 and done.timings.total_ms >= done.timings.ttft_ms


def test_timings_place_the_request_on_the_unix_clock(engine: Engine) -> None:
    before = time.time() * 1e3
    _, done = run(engine, "def main():", GenerationParams(max_tokens=8))
    after = time.time() * 1e3
    t = done.timings
    # Arrival and the last token both lie inside the submit-to-done window.
    assert before - 1 <= t.arrival_unix_ms <= after + 1
    last = t.arrival_unix_ms + t.ttft_ms + sum(t.inter_token_ms)
    assert t.arrival_unix_ms < last <= after + 1


def test_seeded_sampling_repeats(engine: Engine) -> None:
    p = GenerationParams(max_tokens=24, temperature=1.0, seed=5)
    a, _ = run(engine, "x = ", p)
    b, _ = run(engine, "x = ", p)
    assert [t.token_ids for t in a] == [t.token_ids for t in b]


def test_stop_string_cuts_text(engine: Engine) -> None:
    p = GenerationParams(max_tokens=40, temperature=1.0, seed=11)
    free, _ = run(engine, "import os\n", p)
    text = "".join(t.text for t in free)
    assert len(text) > 4
    stop = text[2:4]
    cut, done = run(engine, "import os\n", GenerationParams(**{**vars(p), "stop": (stop,)}))
    assert done.finish_reason is FinishReason.STOP and done.stop == stop
    assert "".join(t.text for t in cut) == text[: text.find(stop)]


def test_cancel_stops_between_steps(engine: Engine) -> None:
    """A cancel that arrives while token 3 is handed over ends generation before token 4."""
    events: queue.Queue[Event] = queue.Queue()
    handles: list = []  # type: ignore[type-arg]
    tokens = [0]

    def sink(ev: Event) -> None:
        events.put(ev)
        tokens[0] += isinstance(ev, TokenEvent)
        if tokens[0] == 3:
            handles[0].cancel()

    prompt = engine.encode_prompt(Prompt(text="a"))
    handles.append(engine.submit(prompt, GenerationParams(max_tokens=200), sink, "c"))
    seen = []
    while not isinstance(ev := events.get(timeout=30), DoneEvent):
        seen.append(ev)
    assert ev.finish_reason is FinishReason.CANCELLED
    assert len(seen) == 3
    assert ev.usage.completion_tokens == 3


def test_prompt_too_long_and_bad_max_tokens(engine: Engine) -> None:
    with pytest.raises(InvalidRequest, match="prompt: is 300 tokens; the context holds 256"):
        engine.encode_prompt(Prompt(text="a" * 300))
    with pytest.raises(InvalidRequest, match="max_tokens"):
        engine.submit([1], GenerationParams(max_tokens=0), lambda e: None, "m")


def test_queue_full_is_reported(random_model_dir: Path) -> None:
    eng = Engine(EngineConfig(model_dir=random_model_dir, max_context=64, max_queue=1))
    # Not started: nothing drains the queue.
    eng._thread = threading.Thread(target=lambda: threading.Event().wait(5), daemon=True)
    eng._thread.start()
    eng.submit([1], GenerationParams(max_tokens=1), lambda e: None, "a")
    with pytest.raises(QueueFull, match="1 requests are already waiting"):
        eng.submit([1], GenerationParams(max_tokens=1), lambda e: None, "b")
