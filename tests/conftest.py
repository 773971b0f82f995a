"""Shared fixtures: random-init models of real architectures, written in HF layout."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def random_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """nib's own random-init test model (byte-level tokenizer, FIM tokens)."""
    from nib.engine.default_model import make_random_model

    return make_random_model(tmp_path_factory.mktemp("random-model"))
