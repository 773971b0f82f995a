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


def test_the_smallest_temperatures_sample_the_argmax_instead_of_failing() -> None:
    """A temperature just above 0 is valid input (the service takes 0..MAX_TEMPERATURE);
    dividing a real logit by 1e-38 gives inf and the softmax NaN, which multinomial
    refuses. The samplers floor the divisor instead (found by tests/integration/
    test_properties.py with temperature = the smallest normal float32)."""
    from nib.engine.speculative import accept_sampled

    logits = _logits(3)
    for t in (1.17549435e-38, 1e-30, 1e-7):
        params = GenerationParams(temperature=t, seed=5)
        assert params.sampling_temperature >= 1e-6
        assert int(Sampler(params, CPU)(logits)) == int(logits.argmax())
        rows = torch.stack([logits, _logits(4)])
        got = accept_sampled(rows, [int(logits.argmax())], params, torch.Generator().manual_seed(0))
        assert got == [int(logits.argmax()), int(_logits(4).argmax())]
    assert GenerationParams(temperature=0.7).sampling_temperature == 0.7
