"""Named run configurations: the H200 run that makes the shipped model, and the CPU smoke run.

The H200 budget (run_all.py --budget-s 560 inside the GPU host's 600 s limit),
as designed (estimates, not yet measured on the GPU host): start-up and imports
~10 s, corpus ~10 s, tokenizer ~10 s, pre-tokenising ~25 s, training everything
left after `reserve_s`, then saving, evaluation (~1.5M held-out tokens), five
sample completions, card and packaging within `reserve_s` (expected ~10-15 s;
the rest is margin).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from training.corpus import CorpusConfig
from training.dataset import FimConfig
from training.shapes import H200, TINY, ModelShape
from training.trainer import TrainConfig


@dataclass(frozen=True)
class Preset:
    name: str
    shape: ModelShape
    corpus: CorpusConfig
    fim: FimConfig
    train: TrainConfig
    tokenizer_sample_bytes: int
    reserve_s: float  # kept back from training for saving, evaluation and packaging
    sample_tokens: int  # new tokens per sample completion
    eval_batch: int  # windows per forward pass in the held-out evaluation
    max_eval_tokens: int  # cap on the held-out split's evaluated tokens

    def with_overrides(
        self,
        *,
        seed: int | None = None,
        max_corpus_bytes: int | None = None,
        compile: bool | None = None,
        batch_size: int | None = None,
        lr: float | None = None,
    ) -> Preset:
        p = self
        if batch_size is not None:
            p = replace(p, train=replace(p.train, batch_size=batch_size))
        if lr is not None:
            p = replace(p, train=replace(p.train, lr=lr))
        if seed is not None:
            p = replace(p, train=replace(p.train, seed=seed))
        if max_corpus_bytes is not None:
            p = replace(p, corpus=replace(p.corpus, max_corpus_bytes=max_corpus_bytes))
        if compile is not None:
            p = replace(p, train=replace(p.train, compile=compile))
        return p


PRESETS = {
    "h200": Preset(
        name="h200",
        shape=H200,
        corpus=CorpusConfig(max_corpus_bytes=400_000_000),
        fim=FimConfig(rate=0.5, variants=2, path_rate=0.5),
        train=TrainConfig(seq_len=1024, batch_size=128, lr=1.5e-3),
        tokenizer_sample_bytes=32_000_000,
        reserve_s=45.0,
        sample_tokens=64,
        eval_batch=32,
        max_eval_tokens=4_000_000,
    ),
    "tiny": Preset(
        name="tiny",
        shape=TINY,
        corpus=CorpusConfig(
            max_corpus_bytes=1_200_000,
            heldout_fraction=0.1,
            max_unit_fraction=0.1,
            heldout_sample_bytes=6_000,
            calibration_sample_bytes=12_000,
        ),
        fim=FimConfig(rate=0.5, variants=1, path_rate=0.5),
        train=TrainConfig(
            seq_len=128, batch_size=8, lr=3e-3, evals=5, eval_batches=2, probe_steps=3
        ),
        tokenizer_sample_bytes=1_200_000,
        reserve_s=8.0,
        sample_tokens=16,
        eval_batch=8,
        max_eval_tokens=8_000,
    ),
}
