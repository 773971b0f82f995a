"""Kernel experiments (engine/cuda/loader.EXPERIMENTS) on the GPU: with all of them on,
the INT4 and 16-bit GEMV and the decode attention kernel tests still hold against their
references, and bench/cuda_variants.py times every variant and finds its logits equal to
the plain build's (each experiment changes no arithmetic, only where data goes)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nib.engine.cuda import loader
from tests.gpu.bench_run import run_bench

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]


def _needs_cuda() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")


def test_the_kernel_tests_pass_with_every_experiment_on() -> None:
    _needs_cuda()
    if not loader.EXPERIMENTS:
        pytest.skip("no experiment is open in the kernel sources (loader.EXPERIMENTS is empty)")
    env = {**os.environ, "NIB_CUDA_DEFINES": ",".join(sorted(loader.EXPERIMENTS))}
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs",
           "tests/gpu/test_cuda_w4a16.py", "tests/gpu/test_cuda_gemv16.py",
           "tests/gpu/test_cuda_attention.py"]  # fmt: skip
    proc = subprocess.run(
        cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False
    )
    tail = proc.stdout[-4000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, tail
    summary = proc.stdout.strip().splitlines()[-1]
    passed = re.search(r"(\d+) passed", summary)
    assert passed and int(passed[1]) > 100, tail
    assert "failed" not in summary and "error" not in summary, tail
    # The one skip the plain run has too: cluster merges of more than 8 splits.
    skips = [line for line in proc.stdout.splitlines() if line.startswith("SKIPPED")]
    assert all("a cluster merge takes 1..8 splits" in line for line in skips), tail


def test_every_variant_is_timed_and_matches_the_plain_build(tmp_path: Path) -> None:
    _needs_cuda()
    args = ["--shapes", "tiny-llama", "--formats", "int4,bf16", "--rounds", "1"]
    result = run_bench("cuda_variants.py", args, tmp_path, "cuda-variants", timeout=900)
    variants = {"plain", *loader.EXPERIMENTS} | (
        {"+".join(sorted(loader.EXPERIMENTS))} if loader.EXPERIMENTS else set()
    )
    for fmt in ("int4", "bf16"):
        rows = {r["variant"]: r for r in result["rows"] if r["format"] == fmt}
        assert set(rows) == variants
        assert rows["plain"]["delta_us"] == 0.0 and rows["plain"]["defines"] == []
        for r in rows.values():
            assert r["identical_logits"] is True and r["max_abs_logit_diff"] == 0.0, r
            assert len(r["step_us_rounds"]) == 1 and r["step_us_median"] > 0


def test_a_config_variant_runs_its_layer_config_in_the_step(tmp_path: Path) -> None:
    """`cfg:` variants: the named config runs for that variant only, its logits are
    compared, and the run does not fail on a reordered sum."""
    _needs_cuda()
    choice = "int4 1024x2816 +residual=int4 mma16 r1w16p4"
    args = ["--shapes", "tiny-llama", "--formats", "int4", "--rounds", "2",
            "--variants", f"plain,cfg:{choice}"]  # fmt: skip
    result = run_bench("cuda_variants.py", args, tmp_path, "cuda-variants", timeout=900)
    rows = {r["variant"]: r for r in result["rows"]}
    assert set(rows) == {"plain", f"cfg:{choice}"}
    assert rows["plain"]["configs"] == {}
    knob, _, label = choice.partition("=")
    assert rows[f"cfg:{choice}"]["configs"] == {knob: label}
    diff = rows[f"cfg:{choice}"]["max_abs_logit_diff"]
    assert diff is not None and diff < 0.5, rows[f"cfg:{choice}"]
    assert all(len(r["step_us_rounds"]) == 2 for r in rows.values())
