"""Sampling: greedy is argmax, seeds reproduce, top-k/top-p restrict the support."""

from __future__ import annotations

import torch

from nib.engine.request import GenerationParams
from nib.engine.sampling import Sampler, filter_logits

CPU = torch.device("cpu")


def _logits(seed: int = 0, v: int = 500) -> torch.Tensor:
    return torch.randn(v, generator=torch.Generator().manual_seed(seed)) * 3


def test_greedy_is_argmax() -> None:
    logits = _logits()
    assert int(Sampler(GenerationParams(), CPU)(logits)) == int(logits.argmax())


def test_same_seed_same_tokens_and_other_seed_differs() -> None:
    params = GenerationParams(temperature=1.0, seed=42)
    runs = []
    for _ in range(2):
        sampler = Sampler(params, CPU)
        runs.append([int(sampler(_logits(i))) for i in range(50)])
    assert runs[0] == runs[1]
    other = Sampler(GenerationParams(temperature=1.0, seed=43), CPU)
    assert [int(other(_logits(i))) for i in range(50)] != runs[0]


def test_top_k_keeps_only_k_largest() -> None:
    logits = _logits()
    kept = torch.isfinite(filter_logits(logits, top_k=7, top_p=1.0))
    assert kept.sum() == 7
    assert set(kept.nonzero().flatten().tolist()) == set(logits.topk(7).indices.tolist())
    sampler = Sampler(GenerationParams(temperature=5.0, top_k=7, seed=1), CPU)
    assert {int(sampler(logits)) for _ in range(300)} <= set(logits.topk(7).indices.tolist())


def test_top_p_keeps_smallest_set_reaching_p() -> None:
    logits = _logits(3)
    probs = logits.softmax(-1)
    kept = torch.isfinite(filter_logits(logits, top_k=0, top_p=0.5))
    mass = probs[kept].sum()
    assert mass >= 0.5
    # Dropping the least likely kept token would fall below p.
    assert mass - probs[kept].min() < 0.5
    assert probs[kept].min() >= probs[~kept].max()
