"""speculative.interleave on a simulated device, and the n-gram index behind the drafts.

The simulated device keeps what a GPU keeps: the KV cache as the token at each
position, the current token and position that decode steps read and advance, and
the steps launched but not yet waited on. Its model's next token depends on the
position as well as the context, so a step fed from the wrong position gives a
different output than plain greedy decoding."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nib.engine.speculative import NgramIndex, Speculator, interleave, lookup_draft


@dataclass
class Model:
    vocab: int
    a: int
    b: int
    c: int = 0
    period: int = 7  # every `period` positions the rule shifts (0: it never does)

    def __call__(self, context: list[int]) -> int:
        drift = len(context) // self.period if self.period else 0
        return (context[-1] * self.a + context[-2] * self.b + self.c + drift) % self.vocab


def greedy(model: Model, prompt: list[int], n: int) -> list[int]:
    out = list(prompt)
    for _ in range(n):
        out.append(model(out))
    return out[len(prompt) :]


@dataclass
class Device:
    """Steps run on launch (as a GPU stream runs them in order); the host learns a
    step's result only by finishing it."""

    model: Model
    cache: list[int] = field(default_factory=list)
    token: int = -1
    pos: int = 0
    in_flight: list[tuple[str, int]] = field(default_factory=list)
    results: dict[int, object] = field(default_factory=dict)
    log: list[str] = field(default_factory=list)
    max_decodes_in_flight: int = 0
    launches: int = 0

    def _launch(self, kind: str, result: object) -> int:
        assert not any(k == "verify" for k, _ in self.in_flight), "a step after a verify"
        if kind == "verify":
            assert not self.in_flight, "a verify while decodes are in flight"
        self.launches += 1
        self.in_flight.append((kind, self.launches))
        self.results[self.launches] = result
        self.max_decodes_in_flight = max(self.max_decodes_in_flight, len(self.in_flight))
        self.log.append(f"launch {kind}")
        return self.launches

    def _finish(self, step: object) -> object:
        assert self.in_flight and self.in_flight[0][1] == step, "steps finish in launch order"
        kind, _ = self.in_flight.pop(0)
        self.log.append(f"finish {kind}")
        return self.results.pop(step)  # type: ignore[call-overload]

    def prefill(self, prompt: list[int]) -> int:
        self.cache = list(prompt)
        self.token, self.pos = self.model(self.cache), len(prompt)
        return self._launch("decode", (self.token, -0.5))

    def launch_decode(self) -> int:
        self.cache[self.pos :] = [self.token]
        self.token, self.pos = self.model(self.cache), self.pos + 1
        return self._launch("decode", (self.token, -0.5))

    def finish_decode(self, step: object) -> tuple[int, float]:
        return self._finish(step)  # type: ignore[return-value]

    def launch_verify(self, tokens: list[int], pos: int) -> int:
        assert len(tokens) <= 8
        self.cache[pos:] = tokens
        rows = [self.model(self.cache[: pos + i + 1]) for i in range(len(tokens))]
        return self._launch("verify", (rows, [-0.25] * len(tokens)))

    def finish_verify(self, step: object, n: int) -> tuple[list[int], list[float]]:
        rows, logprobs = self._finish(step)  # type: ignore[misc]
        assert n == len(rows)
        return rows, logprobs

    def set_state(self, token: int, pos: int) -> None:
        self.token, self.pos = token, pos


def run(model: Model, prompt: list[int], budget: int, spec: Speculator, stop_after: int = -1):  # type: ignore[no-untyped-def]
    device = Device(model)
    out: list[int] = []
    gen = interleave(device, device.prefill(prompt), prompt, budget, spec, max_draft=7)
    for token, _ in gen:
        device.log.append("hand over" if device.in_flight else "hand over, idle")
        out.append(token)
        if len(out) == stop_after:
            gen.close()
            break
    return out, device


def assert_overlapped(log: list[str]) -> None:
    """The point of the schedule: while the host hands over a token the GPU has work,
    unless no more work is coming (every token of the budget is already known). The
    request's first token is the exception: it goes out as soon as it is known."""
    first = log.index("hand over") if "hand over" in log else len(log)
    first = min(first, log.index("hand over, idle") if "hand over, idle" in log else first)
    log = log[first + 1 :]
    if "hand over, idle" in log:
        tail = log[log.index("hand over, idle") :]
        assert not [line for line in tail if line.startswith("launch")], log


MODELS = st.builds(
    Model,
    vocab=st.integers(2, 12),
    a=st.integers(0, 11),
    b=st.integers(0, 11),
    c=st.integers(0, 3),
    period=st.integers(0, 9),
)
PROMPTS = st.lists(st.integers(0, 11), min_size=2, max_size=40)


@settings(max_examples=300, deadline=None)
@given(model=MODELS, prompt=PROMPTS, budget=st.integers(1, 60), k=st.integers(0, 9))
def test_interleaved_steps_give_plain_greedy_output(model, prompt, budget, k) -> None:  # type: ignore[no-untyped-def]
    prompt = [t % model.vocab for t in prompt]
    out, device = run(model, prompt, budget, Speculator(k))
    assert out == greedy(model, prompt, budget)
    assert not device.in_flight, "every launched step was waited on"
    assert device.max_decodes_in_flight <= 2
    assert_overlapped(device.log)
    # The first token goes to the caller as soon as the prefill is waited on.
    first_finish = device.log.index("finish decode")
    assert device.log[first_finish + 1].startswith("hand over"), device.log[:6]
    # No step's work is thrown away: a decode makes one token, a verify at least one.
    assert device.launches <= budget


@settings(max_examples=200, deadline=None)
@given(model=MODELS, prompt=PROMPTS, budget=st.integers(2, 40), stop=st.integers(1, 40))
def test_stopping_early_leaves_at_most_one_step_in_flight(model, prompt, budget, stop) -> None:  # type: ignore[no-untyped-def]
    """A cancel between tokens overruns by at most one step (issue 6 allows two)."""
    prompt = [t % model.vocab for t in prompt]
    out, device = run(model, prompt, budget, Speculator(6), stop_after=stop)
    assert out == greedy(model, prompt, budget)[: min(stop, budget)]
    assert len(device.in_flight) <= 1


def test_without_drafts_a_step_is_always_in_flight_while_a_token_is_handed_over() -> None:
    model = Model(vocab=11, a=3, b=5)
    prompt = [1, 2]
    spec = Speculator(6, enabled=False)
    device = Device(model)
    seen = []
    for token, _ in interleave(device, device.prefill(prompt), prompt, 30, spec, max_draft=7):
        seen.append((token, len(device.in_flight)))
    assert [t for t, _ in seen] == greedy(model, prompt, 30)
    # Every token goes out with the next step running, as the plain pipelined loop has
    # it, but the last.
    assert [n for _, n in seen] == [1] * 29 + [0]
    assert "launch verify" not in device.log


def test_a_predictable_model_is_served_by_verify_steps() -> None:
    """A model that counts modulo 5 is what drafts are for: after the first cycle,
    almost every token comes from a verify step, and there are far fewer steps."""
    model = Model(vocab=5, a=1, b=0, c=1, period=0)  # 0 1 2 3 4 0 1 ...
    prompt = [0, 1, 2, 3, 4, 0, 1]
    spec = Speculator(6)
    out, device = run(model, prompt, 60, spec)
    assert out == greedy(model, prompt, 60)
    assert spec.accepted > 30 and device.launches < 30, (spec.accepted, device.launches)


def test_a_verify_step_takes_at_most_max_draft_drafts() -> None:
    model = Model(vocab=3, a=1, b=0, c=1, period=0)
    prompt = [0, 1, 2, 0, 1, 2, 0]
    device = Device(model)
    lengths = []
    launch = device.launch_verify

    def record(tokens: list[int], pos: int) -> int:
        lengths.append(len(tokens))
        return launch(tokens, pos)

    device.launch_verify = record  # type: ignore[method-assign]
    out = [t for t, _ in interleave(device, device.prefill(prompt), prompt, 40, Speculator(9), 3)]
    assert out == greedy(model, prompt, 40)
    assert lengths and max(lengths) <= 4


@settings(max_examples=300, deadline=None)
@given(tokens=st.lists(st.integers(0, 4), max_size=60), k=st.integers(1, 8), cut=st.integers(0, 60))
def test_the_ngram_index_answers_as_the_scan_does(tokens: list[int], k: int, cut: int) -> None:
    index = NgramIndex()
    for size in range(len(tokens) + 1):
        assert index.draft(tokens[:size], k) == lookup_draft(tokens[:size], k), size
    # A list that is not the one indexed so far (another request) starts afresh.
    other = [*tokens[: min(cut, len(tokens))], 9, 9]
    assert index.draft(other, k) == lookup_draft(other, k)


def test_the_ngram_index_does_not_rescan() -> None:
    """Drafting for a growing context costs the same per token at any length."""
    import time

    tokens = [i % 997 for i in range(4000)]
    index = NgramIndex()
    index.draft(tokens, 6)
    started = time.perf_counter()
    for _ in range(200):
        index.draft(tokens, 6)
    indexed = time.perf_counter() - started
    started = time.perf_counter()
    for _ in range(200):
        lookup_draft([*tokens[:-1], 5000], 6)
    scanned = time.perf_counter() - started
    assert indexed < scanned / 5, (indexed, scanned)


if __name__ == "__main__":
    pytest.main([__file__])
