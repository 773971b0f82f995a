"""The INT4 model on the GPU kernels vs the same model on the CPU reference path."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from nib.engine.default_model import SHIPPED_MODEL
from nib.engine.loader import load_model
from nib.engine.quant.calibrate import HELD_OUT_TEXT
from nib.engine.quant.quality import perplexity
from nib.engine.tokenizer import Tokenizer

pytestmark = pytest.mark.gpu


def test_kernel_path_perplexity_within_half_a_percent_of_cpu_reference(
    random_model_dir: Path,
) -> None:
    model_dir = SHIPPED_MODEL if (SHIPPED_MODEL / "config.json").is_file() else random_model_dir
    ids = Tokenizer(model_dir).encode(HELD_OUT_TEXT.read_text(encoding="utf-8"))[:4096]
    cpu = perplexity(load_model(model_dir, quant="int4"), ids)
    gpu_model = load_model(model_dir, quant="int4", device="cuda", dtype=torch.float16)
    gpu = perplexity(gpu_model, ids)
    dense = perplexity(load_model(model_dir, device="cuda", dtype=torch.float16), ids)
    print(
        f"\n{model_dir.name}: INT4 ppl CPU reference {cpu:.4f}, GPU kernels {gpu:.4f}, fp16 {dense:.4f}"
    )
    assert abs(gpu / cpu - 1) <= 0.005
