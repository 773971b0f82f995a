"""bench/step_ends.py on the GPU: both ends of the step in each variant, on a small model.

The variant with nib's ends launches one kernel fewer per step (the position's add is
gone; the embedding is one kernel either way), and both produce timings."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]


def test_both_variants_are_timed_and_nibs_has_one_kernel_fewer(tmp_path: Path) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    cmd = [sys.executable, "bench/step_ends.py", "--shapes", "tiny-llama", "--formats", "int4",
           "--rounds", "1", "--out", str(tmp_path)]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (path,) = tmp_path.glob("*-step-ends.json")
    result = json.loads(path.read_text())
    assert list(result)[:4] == ["date", "device", "torch", "command"]
    by = {r["variant"]: r for r in result["rows"]}
    assert set(by) == {"pytorch-ends", "nib-ends"}
    assert by["nib-ends"]["kernels_per_step"] == by["pytorch-ends"]["kernels_per_step"] - 1
    for r in by.values():
        assert len(r["step_us_rounds"]) == 1 and r["step_us_median"] > 0
    assert set(result["saved_us"]) == {"tiny-llama int4"}
