"""Shared fixtures: random-init models of real architectures, written in HF layout."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

# Without a GPU, run Triton kernels in Triton's interpreter (numpy on the CPU), so CI
# checks their correctness too. Must be set before triton is first imported.
if not shutil.which("nvidia-smi"):
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest


@pytest.fixture(scope="session")
def random_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """nib's own random-init test model (byte-level tokenizer, FIM tokens)."""
    from nib.engine.default_model import make_random_model

    return make_random_model(tmp_path_factory.mktemp("random-model"))
