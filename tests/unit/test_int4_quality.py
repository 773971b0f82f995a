"""INT4 vs 16-bit quality on held-out code, on the CPU reference path.

Runs on the shipped trained model (engine/assets/nib-tiny-code/) when it is
installed, else on the random-init test model. The bound (INT4 perplexity at
most 1.05x the 16-bit one) is the issue's bound for the trained model; the
random model is held to it too, which it meets easily (its predictions are
nearly uniform), so there the test mainly exercises the machinery.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from nib.engine.default_model import SHIPPED_MODEL
from nib.engine.loader import load_model
from nib.engine.quant.calibrate import HELD_OUT_TEXT
from nib.engine.quant.quality import perplexity
from nib.engine.tokenizer import Tokenizer

BOUND = 1.05
MAX_TOKENS = 4096  # keeps the CPU run short


@pytest.fixture(scope="module")
def quality_model(random_model_dir: Path) -> Path:
    return SHIPPED_MODEL if (SHIPPED_MODEL / "config.json").is_file() else random_model_dir


def held_out_ids(model_dir: Path) -> list[int]:
    return Tokenizer(model_dir).encode(HELD_OUT_TEXT.read_text(encoding="utf-8"))[:MAX_TOKENS]


def top1_agreement(a: torch.nn.Module, b: torch.nn.Module, ids: list[int]) -> float:
    x = torch.tensor([ids[:256]])
    t = x.shape[1]
    with torch.inference_mode():
        pa = a(x, torch.arange(t), t).argmax(-1)
        pb = b(x, torch.arange(t), t).argmax(-1)
    return float((pa == pb).float().mean())


def test_int4_perplexity_within_bound_of_16bit(quality_model: Path, tmp_path: Path) -> None:
    ids = held_out_ids(quality_model)
    dense = load_model(quality_model)
    rtn = load_model(quality_model, quant="int4")
    p16, p_rtn = perplexity(dense, ids), perplexity(rtn, ids)
    ratio = p_rtn / p16
    print(f"\n{quality_model.name}: ppl 16-bit {p16:.4f}, INT4 RTN {p_rtn:.4f} ({ratio:.4f}x)")
    print(f"teacher-forced top-1 agreement RTN vs 16-bit: {top1_agreement(dense, rtn, ids):.3f}")
    if ratio <= BOUND:
        return
    # RTN missed: GPTQ is the second chance.
    from nib.sdk.cli import main

    out = tmp_path / "gptq"
    argv = ["quantize", "--model", str(quality_model), "--out", str(out), "--device", "cpu"]
    assert main([*argv, "--samples", "32", "--seq-len", "256"]) == 0
    gptq = load_model(out, quant="int4")
    p_gptq = perplexity(gptq, ids)
    print(f"INT4 GPTQ {p_gptq:.4f} ({p_gptq / p16:.4f}x)")
    assert p_gptq / p16 <= BOUND
