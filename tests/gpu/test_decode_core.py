"""The GPU decode core: graphs equal eager, equal transformers, sampling on the device,
cancellation leaves the next request untouched, capture failures fall back."""

from __future__ import annotations

import queue
import threading
from pathlib import Path

import pytest
import torch

from nib.engine.engine import Engine, EngineConfig
from nib.engine.request import DoneEvent, Event, FinishReason, GenerationParams, TokenEvent

from .models import save_random_hf_model

ARCHS = ["llama", "qwen2"]


@pytest.fixture(scope="module", params=ARCHS)
def model_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_random_hf_model(request.param, tmp_path_factory.mktemp(request.param))


def start(model_dir: Path, **kw: object) -> Engine:
    config = EngineConfig(model_dir=model_dir, device="cuda", max_context=1024, **kw)  # type: ignore[arg-type]
    engine = Engine(config).start()
    assert engine.wait_ready(300), engine.failure
    return engine


def generate(
    engine: Engine, ids: list[int], params: GenerationParams
) -> tuple[list[int], DoneEvent]:
    events: queue.Queue[Event] = queue.Queue()
    engine.submit(ids, params, events.put, "t")
    tokens: list[int] = []
    while not isinstance(ev := events.get(timeout=120), DoneEvent):
        assert isinstance(ev, TokenEvent)
        tokens.extend(ev.token_ids)
    return tokens, ev


PROMPT = list(b"def fibonacci(n):\n    if n < 2:\n        return n\n")


@pytest.fixture(scope="module")
def engines(model_dir: Path):
    # Same kernel choices in both (no timing-based tuning), so only the graphs differ.
    graphs = start(model_dir, tune_kernels=False)
    eager = start(model_dir, use_graphs=False, tune_kernels=False)
    # The same drafting decisions too, should drafting be on (by default it is off on a
    # GPU): they weigh the verify steps' measured cost, which only graphs can be timed
    # for, and a token a verify step scores (M > 1 products) may round differently from
    # the one a decode step scores.
    eager.runner.verify_costs = dict(graphs.runner.verify_costs)
    yield graphs, eager
    graphs.stop()
    eager.stop()


def test_every_graph_captured(engines) -> None:  # type: ignore[no-untyped-def]
    graphs, _ = engines
    states = graphs.runner.states
    assert states and all(s.ready and not s.fallback for s in states.values()), [
        (s.name, s.error) for s in states.values() if not s.ready
    ]
    info = graphs.info()
    assert any(name.startswith("decode-greedy") for name, _, _ in info.graphs)


def test_graphs_equal_eager_for_64_greedy_steps(engines) -> None:  # type: ignore[no-untyped-def]
    graphs, eager = engines
    for prompt in (PROMPT, PROMPT[:5], PROMPT * 6):
        a, done_a = generate(graphs, prompt, GenerationParams(max_tokens=64))
        b, _ = generate(eager, prompt, GenerationParams(max_tokens=64))
        assert len(a) == 64 and done_a.finish_reason is FinishReason.LENGTH
        assert a == b


def test_graph_logits_equal_eager_logits(engines) -> None:  # type: ignore[no-untyped-def]
    """Replay captured prefill/decode graphs, then run the same bodies eagerly on the same state."""
    from nib.engine.graphs import GraphRunner

    graphs, _ = engines
    runner = GraphRunner(graphs.model, 1024, buckets=(64,), keep_logits=True)
    runner.capture()
    assert all(s.ready for s in runner.states.values())
    runner.prefill(PROMPT, True).synchronize()
    for step in range(6):
        parity = step % 2
        pos, token = runner.pos.clone(), runner.token.clone()
        runner.decode(parity, True).synchronize()
        replayed, next_token = runner.last_logits.clone(), runner.token.clone()
        runner.pos.copy_(pos)
        runner.token.copy_(token)
        runner.stream.wait_stream(torch.cuda.current_stream())  # the copies above come first
        with torch.cuda.stream(runner.stream), torch.inference_mode():
            runner.bodies[runner._decode_name(parity, True)]()
        runner.stream.synchronize()
        torch.testing.assert_close(replayed, runner.last_logits, atol=1e-2, rtol=1e-2)
        assert torch.equal(next_token, runner.token)


def test_seeded_sampling_on_device_is_reproducible(engines) -> None:  # type: ignore[no-untyped-def]
    graphs, _ = engines
    p = GenerationParams(max_tokens=48, temperature=0.9, top_k=50, top_p=0.95, seed=1234)
    a, _ = generate(graphs, PROMPT, p)
    b, _ = generate(graphs, PROMPT, p)
    c, _ = generate(graphs, PROMPT, GenerationParams(**{**vars(p), "seed": 99}))
    assert a == b
    assert a != c
    greedy, _ = generate(graphs, PROMPT, GenerationParams(max_tokens=48))
    assert a != greedy


def test_top_k_one_is_greedy(engines) -> None:  # type: ignore[no-untyped-def]
    graphs, _ = engines
    greedy, _ = generate(graphs, PROMPT, GenerationParams(max_tokens=32))
    k1, _ = generate(
        graphs, PROMPT, GenerationParams(max_tokens=32, temperature=1.5, top_k=1, seed=3)
    )
    assert k1 == greedy


def test_cancel_and_supersede_leave_the_next_request_untouched(engines) -> None:  # type: ignore[no-untyped-def]
    graphs, _ = engines
    reference, _ = generate(graphs, PROMPT, GenerationParams(max_tokens=40))
    sampled_ref, _ = generate(
        graphs, PROMPT, GenerationParams(max_tokens=40, temperature=1.0, seed=8)
    )
    for reason in (FinishReason.CANCELLED, FinishReason.SUPERSEDED):
        events: queue.Queue[Event] = queue.Queue()
        got = threading.Event()
        count = [0]

        def sink(ev: Event, events=events, count=count, got=got) -> None:  # type: ignore[no-untyped-def]
            events.put(ev)
            count[0] += 1
            if count[0] == 5:
                got.set()

        handle = graphs.submit(
            PROMPT * 3, GenerationParams(max_tokens=900, temperature=1.0, seed=5), sink, "x"
        )
        assert got.wait(60)
        handle.cancel(reason)
        while not isinstance(ev := events.get(timeout=60), DoneEvent):
            pass
        assert ev.finish_reason is reason
        assert ev.usage.completion_tokens <= 7  # the cancel cost at most one or two steps
        assert generate(graphs, PROMPT, GenerationParams(max_tokens=40))[0] == reference
        again, _ = generate(
            graphs, PROMPT, GenerationParams(max_tokens=40, temperature=1.0, seed=8)
        )
        assert again == sampled_ref


def test_matches_transformers_greedy_in_fp32(model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).cuda().eval()
    ids = torch.tensor([PROMPT], device="cuda")
    with torch.no_grad():
        ref = hf.generate(ids, max_new_tokens=32, min_new_tokens=32, do_sample=False)[
            0, len(PROMPT) :
        ]
    engine = start(model_dir, dtype="float32", token_healing=False)  # plain greedy, like HF
    try:
        ours, _ = generate(engine, PROMPT, GenerationParams(max_tokens=32))
    finally:
        engine.stop()
    assert ours == ref.tolist()


def test_capture_failure_falls_back_to_eager_and_keeps_serving(
    model_dir: Path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    from nib.engine import graphs as graphs_mod

    real = graphs_mod.GraphRunner._decode_body

    def broken(self, parity: int, greedy: bool) -> None:  # type: ignore[no-untyped-def]
        if torch.cuda.is_current_stream_capturing() and parity == 1 and greedy:
            raise RuntimeError("injected capture failure")
        real(self, parity, greedy)

    monkeypatch.setattr(graphs_mod.GraphRunner, "_decode_body", broken)
    engine = start(model_dir, speculative_k=0)  # plain decoding alternates both parities
    try:
        state = engine.runner.states["decode-greedy-1"]
        assert state.fallback and not state.ready and "injected" in state.error
        tokens, done = generate(engine, PROMPT, GenerationParams(max_tokens=20))
        assert len(tokens) == 20 and done.finish_reason is FinishReason.LENGTH
        assert engine.runner.fallbacks["decode-greedy-1"] >= 9
    finally:
        engine.stop()


def test_prefix_reuse_on_the_gpu_matches_cold_prefill(model_dir: Path) -> None:
    """Chunk graphs after a reused prefix give the tokens a cold prefill gives (fp32, so
    the two attention kernels agree to rounding), and fewer prompt tokens are computed."""
    warm = start(model_dir, dtype="float32", tune_kernels=False)
    cold = start(model_dir, dtype="float32", tune_kernels=False, prefix_cache_entries=0)
    try:
        text = list(b"def parse(line):\n    fields = line.split(',')\n    return fields[0]\n" * 3)
        cached = []
        for cut in (60, 75, 90, 131, len(text)):
            ids = text[:cut]
            a, done = generate(warm, ids, GenerationParams(max_tokens=24))
            b, _ = generate(cold, ids, GenerationParams(max_tokens=24))
            assert a == b, cut
            cached.append(done.usage.cached_prompt_tokens)
        assert cached[0] == 0 and all(c > 0 for c in cached[1:]), cached
        assert not warm.runner.fallbacks
        assert warm.prompt_tokens_computed < cold.prompt_tokens_computed
    finally:
        warm.stop()
        cold.stop()


def test_speculative_decoding_on_the_gpu_gives_the_same_tokens(model_dir: Path) -> None:
    """Verify graphs + prompt-lookup drafts: identical greedy output (fp32, so the M>1
    verify matmuls and the M=1 decode GEMV agree to rounding), with drafts accepted."""
    spec = start(
        model_dir, dtype="float32", tune_kernels=False, speculative_k=6, prefix_cache_entries=0
    )
    plain = start(
        model_dir, dtype="float32", tune_kernels=False, speculative_k=0, prefix_cache_entries=0
    )
    # Start-up timed every verify graph against a decode step (Speculator.costs)...
    costs = spec.runner.verify_costs
    assert set(costs) == set(spec.runner.verify_buckets)
    assert all(0.3 < c < 50 for c in costs.values()), costs
    # ...which can rule drafts out on this small model; this test wants them verified.
    spec.runner.verify_costs = {}
    try:
        for prompt in (PROMPT * 3, list(b"value = table[key]\nvalue = table[")):
            a, _ = generate(spec, prompt, GenerationParams(max_tokens=80))
            b, _ = generate(plain, prompt, GenerationParams(max_tokens=80))
            assert a == b
        assert spec.speculation_stats["verifies"] > 0
        assert spec.speculation_stats["accepted"] > 0
        # A request cancelled with steps in flight (decodes queued ahead, or a verify)
        # leaves the next one's tokens as they were.
        reference, _ = generate(plain, PROMPT * 3, GenerationParams(max_tokens=60))
        for after in (1, 5, 12):
            events: queue.Queue[Event] = queue.Queue()
            got, count = threading.Event(), [0]

            def sink(ev: Event, events=events, count=count, got=got, after=after) -> None:  # type: ignore[no-untyped-def]
                events.put(ev)
                count[0] += 1
                if count[0] == after:
                    got.set()

            handle = spec.submit(PROMPT * 3, GenerationParams(max_tokens=900), sink, "c")
            assert got.wait(60)
            handle.cancel(FinishReason.CANCELLED)
            while not isinstance(ev := events.get(timeout=60), DoneEvent):
                pass
            assert ev.finish_reason is FinishReason.CANCELLED
            assert ev.usage.completion_tokens <= after + 16
            assert generate(spec, PROMPT * 3, GenerationParams(max_tokens=60))[0] == reference
        assert not spec.runner.fallbacks
    finally:
        spec.stop()
        plain.stop()
