"""The training loop: reproducible with a fixed seed and step count, and it learns."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from training.shapes import TINY
from training.trainer import TrainConfig, train

CFG = TrainConfig(seq_len=32, batch_size=4, lr=3e-3, evals=2, eval_batches=1)


def _stream(seed: int, n: int = 6000) -> np.ndarray:
    # A learnable pattern: the same 20 short "words" over a small alphabet, in a seeded order.
    vocab = np.random.default_rng(0)
    words = [vocab.integers(5, 60, size=vocab.integers(2, 6)) for _ in range(20)]
    rng = np.random.default_rng(seed)
    out = np.concatenate([words[i] for i in rng.integers(0, 20, size=n)])
    return out.astype(np.uint16)


def _run(steps: int) -> list[tuple[float, float]]:
    result = train(
        TINY,
        CFG,
        _stream(0),
        _stream(1, 800),
        eos_id=0,
        device=torch.device("cpu"),
        seconds=600,
        steps=steps,
        log=lambda _: None,
    )
    assert result.steps == steps and not result.stopped_by_deadline
    return [(p.train_loss, p.heldout_loss) for p in result.curve]


def test_same_seed_and_steps_give_the_same_run() -> None:
    torch.set_num_threads(1)
    first, second = _run(12), _run(12)
    assert first == second


def test_loss_falls() -> None:
    curve = _run(30)
    assert curve[-1][1] < curve[0][1]
    assert curve[-1][1] < np.log(TINY.vocab_size) - 2.0  # far below a uniform guess


def test_a_deadline_stops_training_early() -> None:
    result = train(
        TINY,
        CFG,
        _stream(0),
        _stream(1, 800),
        eos_id=0,
        device=torch.device("cpu"),
        seconds=0.0,
        steps=50,
        log=lambda _: None,
    )
    assert result.stopped_by_deadline and result.steps < 50
    with pytest.raises(ValueError, match="shorter than one window"):
        train(
            TINY,
            CFG,
            _stream(0),
            _stream(1, 5),
            eos_id=0,
            device=torch.device("cpu"),
            seconds=10,
            steps=1,
            log=lambda _: None,
        )
