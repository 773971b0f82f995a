"""bench/step_ends.py on the GPU: both ends of the step in each variant, on a small model.

The variant with nib's ends launches one kernel fewer per step (the position's add is
gone; the embedding is one kernel either way), and both produce timings."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.gpu.bench_run import run_bench

pytestmark = pytest.mark.gpu


def test_both_variants_are_timed_and_nibs_has_one_kernel_fewer(tmp_path: Path) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    args = ["--shapes", "tiny-llama", "--formats", "int4", "--rounds", "1"]
    result = run_bench("step_ends.py", args, tmp_path, "step-ends")
    by = {r["variant"]: r for r in result["rows"]}
    assert set(by) == {"pytorch-ends", "nib-ends"}
    assert by["nib-ends"]["kernels_per_step"] == by["pytorch-ends"]["kernels_per_step"] - 1
    for r in by.values():
        assert len(r["step_us_rounds"]) == 1 and r["step_us_median"] > 0
    assert set(result["saved_us"]) == {"tiny-llama int4"}


def test_fused_pick_bench_times_both_and_the_fused_step_has_one_kernel_fewer(
    tmp_path: Path,
) -> None:
    """bench/fused_pick.py: the greedy kernel is gone from the step with the pick fused."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    args = ["--shapes", "tiny-llama", "--rounds", "1"]
    result = run_bench("fused_pick.py", args, tmp_path, "fused-pick")
    by = {r["variant"]: r for r in result["rows"]}
    assert set(by) == {"separate-pick", "fused-pick"}
    assert by["fused-pick"]["kernels_per_step"] == by["separate-pick"]["kernels_per_step"] - 1
    for r in by.values():
        assert len(r["step_us_rounds"]) == 1 and r["step_us_median"] > 0
    assert set(result["saved_us"]) == {"tiny-llama"}
