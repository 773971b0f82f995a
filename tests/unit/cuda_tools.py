"""Shared by the CPU tests of nib's CUDA sources (they compile, they do not run)."""

from __future__ import annotations

import pytest

from nib.engine.cuda import build


def nvcc_or_skip() -> None:
    """Skip the calling test, saying why, on a machine without nvcc."""
    try:
        build.nvcc()
    except build.CudaBuildError as exc:
        pytest.skip(f"no nvcc here: {exc}")
