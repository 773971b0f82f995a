"""Prefix reuse: identical results to a cold prefill, fewer prompt tokens computed."""

from __future__ import annotations

import queue
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from nib.engine.engine import Engine, EngineConfig
from nib.engine.kv_cache import KVCache
from nib.engine.loader import load_model
from nib.engine.prefix_cache import PrefixCache, common_prefix
from nib.engine.request import DoneEvent, Event, GenerationParams, Prompt, TokenEvent


def test_common_prefix() -> None:
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix([], [1]) == 0
    assert common_prefix([1, 2], [1, 2]) == 2


@given(
    st.lists(st.integers(0, 2), max_size=70),
    st.lists(st.integers(0, 2), max_size=70),
    st.integers(0, 70),
)
def test_common_prefix_is_the_first_difference(a: list[int], tail: list[int], keep: int) -> None:
    b = a[:keep] + tail  # shares at least min(keep, len(a)) tokens with a
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    assert common_prefix(a, b) == common_prefix(b, a) == n


def test_logits_after_reused_prefix_equal_cold_prefill(random_model_dir: Path) -> None:
    model = load_model(random_model_dir)
    model.setup_cache(128)
    ids = torch.randint(0, 256, (1, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        cold = model(ids, torch.arange(40), 40)[0, -1]
        model(ids[:, :25], torch.arange(25), 25)  # the cached prefix
        warm = model(ids[:, 25:], torch.arange(25, 40), 40)[0, -1]
    torch.testing.assert_close(warm, cold, atol=1e-5, rtol=1e-5)


def _caches(n: int = 2) -> list[KVCache]:
    caches = [KVCache(64, 2, 8, torch.float32, torch.device("cpu")) for _ in range(n)]
    for c in caches:
        c.k.normal_()
        c.v.normal_()
    return caches


def test_stash_and_restore_copy_the_right_positions() -> None:
    caches = _caches()
    pc = PrefixCache(caches, max_entries=3, budget_bytes=1 << 20)
    a = list(range(10))
    pc.commit("A", a)
    a_k = caches[0].k[:, :, :10].clone()
    assert pc.acquire("B", [99, 98, 97, 96, 95]) == 0  # nothing shared: A is stashed
    caches[0].k.normal_()  # B's prefill overwrites the working cache
    pc.commit("B", [99, 98, 97, 96, 95])
    reused = pc.acquire("A", [*a, 10, 11])
    assert reused == 10
    assert torch.equal(caches[0].k[:, :, :10], a_k), "A's keys were not restored"


def test_eviction_respects_entries_and_budget() -> None:
    caches = _caches()
    pc = PrefixCache(caches, max_entries=2, budget_bytes=1 << 20)
    for i, session in enumerate("ABC"):
        pc.acquire(session, [i] * 8)
        pc.commit(session, [i] * 8)
    assert len(pc.entries) <= 2
    assert {e.session for e in pc.entries} == {"B", "C"}
    tiny = PrefixCache(_caches(), max_entries=4, budget_bytes=1)
    tiny.commit("A", [1] * 8)
    tiny.acquire("B", [2] * 8)
    assert all(e.stash is None for e in tiny.entries), "a stash over budget must be dropped"


def _run(engine: Engine, prompt: str, session: str, **kw: object) -> tuple[list[int], DoneEvent]:
    events: queue.Queue[Event] = queue.Queue()
    ids = engine.encode_prompt(Prompt(text=prompt))
    engine.submit(ids, GenerationParams(**kw), events.put, "r", session)  # type: ignore[arg-type]
    tokens: list[int] = []
    while not isinstance(ev := events.get(timeout=60), DoneEvent):
        assert isinstance(ev, TokenEvent)
        tokens.extend(ev.token_ids)
    return tokens, ev


@pytest.fixture(scope="module")
def engines(random_model_dir: Path):
    warm = Engine(EngineConfig(model_dir=random_model_dir, max_context=512)).start()
    cold = Engine(
        EngineConfig(model_dir=random_model_dir, max_context=512, prefix_cache_entries=0)
    ).start()
    assert warm.wait_ready(60) and cold.wait_ready(60)
    yield warm, cold
    warm.stop()
    cold.stop()


def test_typing_reuses_the_prefix_and_matches_cold(engines) -> None:  # type: ignore[no-untyped-def]
    warm, cold = engines
    text = "def parse(line):\n    fields = line.split(',')\n    return "
    pieces = [text[:20], text[:33], text[:45], text]
    cached = []
    for piece in pieces:
        a, done = _run(warm, piece, "editor-1", max_tokens=12)
        b, _ = _run(cold, piece, "editor-1", max_tokens=12)
        assert a == b
        cached.append(done.usage.cached_prompt_tokens)
    assert cached[0] == 0 and all(c > 0 for c in cached[1:]), cached
    # An edit above the cursor invalidates everything after it.
    edited = "def parse(row):\n" + text[len("def parse(line):\n") :]
    a, done = _run(warm, edited, "editor-1", max_tokens=12)
    assert a == _run(cold, edited, "editor-1", max_tokens=12)[0]
    assert done.usage.cached_prompt_tokens == len("def parse(")


def test_interleaved_sessions_keep_their_prefixes(engines) -> None:  # type: ignore[no-untyped-def]
    warm, cold = engines
    a_text, b_text = "import os\nimport sys\n\n", "class Point:\n    x: int\n"
    _run(warm, a_text, "A", max_tokens=8)
    _run(warm, b_text, "B", max_tokens=8)
    tokens, done = _run(warm, a_text + "def main():", "A", max_tokens=8, temperature=0.7, seed=4)
    assert done.usage.cached_prompt_tokens >= len(a_text) - 1
    assert (
        tokens == _run(cold, a_text + "def main():", "A", max_tokens=8, temperature=0.7, seed=4)[0]
    )
    before = warm.prompt_tokens_reused
    _run(warm, b_text + "    y: int\n", "B", max_tokens=4)
    assert warm.prompt_tokens_reused - before >= len(b_text) - 1
