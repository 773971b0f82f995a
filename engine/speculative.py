"""Prompt-lookup speculative decoding: draft tokens from the context, verify in one pass.

Code repeats itself: identifiers, argument lists, whole lines seen a few lines
above. When the last few tokens occurred earlier in the prompt or the output,
the tokens that followed them then are a cheap guess for what follows now. One
forward pass over [current token, draft...] scores every draft position; with
greedy decoding we keep the drafts the model would have produced itself (the
output is identical to plain decoding) plus one token of its own. When
sampling, each draft d is kept with probability p(d) (the standard
speculative-sampling rule for a draft that proposes d with certainty); on the
first rejection the replacement is drawn from p without d, so the output has
exactly the distribution of plain sampling.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from nib.engine.request import GenerationParams
from nib.engine.sampling import filter_logits

# Drafts a verify step holds: the GPU's verify graphs take the current token and up to 7
# more (graphs.VERIFY_BUCKETS); `nib serve --speculative-k` is held to it on every device.
MAX_DRAFT = 7


def lookup_draft(tokens: list[int], k: int, max_ngram: int = 3, min_ngram: int = 1) -> list[int]:
    """Up to k tokens that followed the most recent earlier occurrence of the last
    n-gram of `tokens` (longest n first); [] if there is none."""
    size = len(tokens)
    for n in range(min(max_ngram, size - 1), min_ngram - 1, -1):
        tail = tokens[size - n :]
        for start in range(size - n - 1, -1, -1):
            if tokens[start : start + n] == tail:
                follow = tokens[start + n : start + n + k]
                if follow:
                    return follow
    return []


class NgramIndex:
    """lookup_draft's answer for a growing token list in O(k) per call instead of a scan
    of the whole list: for every n-gram (n <= max_ngram) that has a token after it, the
    start of its latest occurrence. The list only grows by appending; a shorter one, or
    one whose token at the last indexed place differs, starts the index afresh."""

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self._latest: dict[tuple[int, ...], int] = {}
        self._tokens: list[int] = []

    def _extend(self, tokens: Sequence[int]) -> None:
        seen = self._tokens
        if seen and (len(tokens) < len(seen) or tokens[len(seen) - 1] != seen[-1]):
            self._latest.clear()
            seen.clear()
        for token in tokens[len(seen) :]:
            end = len(seen)  # the n-grams ending at end - 1 now have a follower
            for n in range(self.min_ngram, min(self.max_ngram, end) + 1):
                self._latest[tuple(seen[end - n : end])] = end - n
            seen.append(token)

    def draft(self, tokens: Sequence[int], k: int) -> list[int]:
        """The same list as lookup_draft(tokens, k, max_ngram, min_ngram)."""
        self._extend(tokens)
        seen, size = self._tokens, len(self._tokens)
        for n in range(min(self.max_ngram, size - 1), self.min_ngram - 1, -1):
            start = self._latest.get(tuple(seen[size - n :]))
            # The tail's own occurrence has no follower yet, so any hit lies before it.
            if start is not None:
                return seen[start + n : start + n + k]
        return []


def accept_greedy(rows: Sequence[int] | torch.Tensor, draft: list[int]) -> list[int]:
    """rows [k+1] argmax tokens of the verify pass -> accepted drafts + one model token."""
    out: list[int] = []
    for i, d in enumerate(draft):
        predicted = int(rows[i])
        if predicted != d:
            out.append(predicted)
            return out
        out.append(d)
    out.append(int(rows[len(draft)]))
    return out


def accept_sampled(
    logits: torch.Tensor, draft: list[int], params: GenerationParams, generator: torch.Generator
) -> list[int]:
    """logits [k+1, V] of the verify pass -> tokens under the speculative-sampling rule."""
    probs = filter_logits(
        logits.float() / params.sampling_temperature, params.top_k, params.top_p
    ).softmax(-1)
    out: list[int] = []
    for i, d in enumerate(draft):
        p = probs[i]
        u = torch.rand((), generator=generator, device=p.device)
        if u < p[d]:
            out.append(d)
            continue
        residual = p.clone()
        residual[d] = 0.0
        if residual.sum() <= 0:  # p was all on d (u hit the rounding gap): keep d
            out.append(d)
            continue
        out.append(int(torch.multinomial(residual / residual.sum(), 1, generator=generator)))
        return out
    out.append(int(torch.multinomial(probs[len(draft)], 1, generator=generator)))
    return out


@dataclass
class Speculator:
    """Per-request drafting state. A draft is verified only when it is expected to pay:
    1 + (share of drafted tokens accepted so far) x (its length) tokens, against
    min_gain x what its verify step costs in decode steps. Drafting turns itself off
    when drafts keep missing, or when the verify steps of the last window brought fewer
    tokens than their cost.

    `costs` maps a verify step's length (tokens in, the smallest captured length that
    holds current token + drafts) to its time in decode steps, measured at start-up
    (GraphRunner.measure_step_costs); a length it lacks costs one decode step."""

    k: int
    min_accept_rate: float = 0.3  # accepted drafts per drafted token, over the window
    # Tokens per verify step over its cost in decode steps: below 1 plain decoding is
    # faster; the margin covers the host's gap before each verify launch, which the
    # measured costs leave out.
    min_gain: float = 1.1
    window: int = 8  # verify steps the rates are judged over
    costs: dict[int, float] = field(default_factory=dict)
    # Before a request's first verify, its acceptance counts as this many drafted tokens
    # of which half were accepted.
    prior_drafted: int = 4
    enabled: bool = True
    drafted: int = 0
    accepted: int = 0
    verifies: int = 0
    history: list[tuple[int, int, float]] = field(default_factory=list)
    index: NgramIndex = field(default_factory=NgramIndex)

    def draft(self, tokens: list[int], budget: int, limit: int | None = None) -> list[int]:
        """Drafts for what follows `tokens`: at most k, `limit` and budget - 1 of them,
        and none unless verifying them is expected to pay."""
        if not self.enabled or self.k <= 0 or budget < 2:
            return []
        longest = self.k if limit is None else min(self.k, limit)
        if not self.pays(longest):  # not even the longest draft would: stop looking
            self.enabled = False
            return []
        draft = self.index.draft(tokens, min(longest, budget - 1))
        return draft if draft and self.pays(len(draft)) else []

    def pays(self, drafts: int) -> bool:
        """Whether a verify step of `drafts` drafts is expected to bring min_gain tokens
        per decode step of its measured cost."""
        share = (self.accepted + self.prior_drafted / 2) / (self.drafted + self.prior_drafted)
        return 1 + share * drafts >= self.min_gain * self.cost(drafts + 1)

    def cost(self, tokens: int) -> float:
        """A verify step of `tokens` tokens, in decode steps."""
        fits = [n for n in self.costs if n >= tokens]
        return self.costs[min(fits)] if fits else 1.0

    def record(self, drafted: int, accepted: int) -> None:
        self.drafted += drafted
        self.accepted += accepted
        self.verifies += 1
        self.history = [
            *self.history[-(self.window - 1) :],
            (drafted, accepted, self.cost(drafted + 1)),
        ]
        if len(self.history) == self.window:
            d = sum(h[0] for h in self.history)
            a = sum(h[1] for h in self.history)
            gain = (a + len(self.history)) / sum(h[2] for h in self.history)
            if (d and a / d < self.min_accept_rate) or gain < self.min_gain:
                self.enabled = False


class StepBackend(Protocol):
    """What interleave() drives: greedy steps launched without waiting, finished later.
    A decode step reads the current token and position from the device and advances
    them there; a verify step scores [current token, drafts...] from a position."""

    def launch_decode(self) -> object: ...

    def finish_decode(self, step: object) -> tuple[int, float]: ...

    def launch_verify(self, tokens: list[int], pos: int) -> object: ...

    def finish_verify(self, step: object, n: int) -> tuple[list[int], list[float]]: ...

    def set_state(self, token: int, pos: int) -> None: ...


def interleave(
    backend: StepBackend,
    first: object,
    history: list[int],
    budget: int,
    spec: Speculator,
    max_draft: int,
) -> Iterator[tuple[int, float]]:
    """Greedy (token, logprob) pairs, up to budget, from plain decode steps and verify
    steps, the GPU kept busy while the host hands tokens over.

    `first` is a step in flight that yields the first token after `history` (the
    prompt) as a decode step would: a prefill. While no draft is in sight this is the
    plain pipelined loop: one decode step queued behind the one the host waits for,
    and a token handed over as soon as its step is waited on, the next step already
    running. When the context offers a draft, no further decode is queued; once those
    in flight are in, the draft (looked up again on the now complete context, at most
    `max_draft` tokens) is verified in one step, and the step after it is launched
    before the verified tokens are handed over (the request's first token excepted:
    it goes out as soon as it is known). Nothing launched is wasted: every decode's
    token and every accepted draft is handed over, and the output is that of plain
    greedy decoding. A caller that stops after a token leaves at most one step in
    flight to finish on the device."""
    history = list(history)  # the prompt, then each token once it is known on the host
    ready: list[tuple[int, float]] = []  # known on the host, not yet handed over
    decodes: collections.deque[object] = collections.deque([first])
    known = 0  # tokens known on the host (handed over or ready)
    while True:
        if ready and (decodes or known == len(ready)):
            # A step still runs (or this is the request's first token): hand over now.
            yield from ready
            ready = []
        verify: tuple[object, list[int]] | None = None
        draft = spec.draft(history, budget - known, max_draft)
        if draft and not decodes:
            # The newest token sits at len(history) - 1: it and the drafts go in.
            verify = (backend.launch_verify([history[-1], *draft], len(history) - 1), draft)
        elif not draft and len(decodes) < 2 and known + len(decodes) < budget:
            decodes.append(backend.launch_decode())
        yield from ready  # a verify step's tokens, the next step launched
        ready = []
        if verify is not None:
            step, draft = verify
            rows, logprobs = backend.finish_verify(step, len(draft) + 1)
            accepted = accept_greedy(rows, draft)
            spec.record(len(draft), len(accepted) - 1)
            ready = list(zip(accepted, logprobs, strict=False))
            # The next decode step feeds the last accepted token, which sits here:
            backend.set_state(accepted[-1], len(history) - 1 + len(accepted))
        elif decodes:
            ready = [backend.finish_decode(decodes.popleft())]
        else:
            return
        known += len(ready)
        history.extend(t for t, _ in ready)
