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

from dataclasses import dataclass, field

import torch

from nib.engine.request import GenerationParams
from nib.engine.sampling import filter_logits


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


def accept_greedy(rows: torch.Tensor, draft: list[int]) -> list[int]:
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
    probs = filter_logits(logits.float() / params.temperature, params.top_k, params.top_p).softmax(
        -1
    )
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
    """Per-request drafting state: turns itself off when drafts keep missing."""

    k: int
    min_accept_rate: float = 0.3  # accepted drafts per drafted token, over the window
    window: int = 8  # verify steps the rate is judged over
    enabled: bool = True
    drafted: int = 0
    accepted: int = 0
    verifies: int = 0
    history: list[tuple[int, int]] = field(default_factory=list)

    def draft(self, tokens: list[int], budget: int) -> list[int]:
        if not self.enabled or self.k <= 0 or budget < 2:
            return []
        return lookup_draft(tokens, min(self.k, budget - 1))

    def record(self, drafted: int, accepted: int) -> None:
        self.drafted += drafted
        self.accepted += accepted
        self.verifies += 1
        self.history = [*self.history[-(self.window - 1) :], (drafted, accepted)]
        if len(self.history) == self.window:
            d = sum(h[0] for h in self.history)
            a = sum(h[1] for h in self.history)
            if d and a / d < self.min_accept_rate:
                self.enabled = False
