"""The whole training pipeline on the CPU: tiny corpus, tiny model, a short wall-clock budget.

Runs training/run_all.py exactly as the GPU run does (corpus from this machine's
own standard library and site-packages, tokenizer, training, evaluation, card,
packaging), installs the result with training/unpack.py, and checks it the way
the shipped model is checked.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from . import model_checks

ROOT = Path(__file__).resolve().parents[2]
BUDGET_S = 40


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("pipeline")
    out, dest = base / "out", base / "model"
    run = subprocess.run(
        [
            sys.executable,
            "training/run_all.py",
            "--out",
            str(out),
            "--work",
            str(base / "work"),
            "--preset",
            "tiny",
            "--device",
            "cpu",
            "--threads",
            "1",
            "--budget-s",
            str(BUDGET_S),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    assert "==== summary ====" in run.stdout
    returned = sorted(p.name for p in out.iterdir())
    assert len(returned) <= 8 and "nib-tiny-code-files.tar.gz" in returned
    unpack = subprocess.run(
        [sys.executable, "training/unpack.py", str(out), "--dest", str(dest)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert unpack.returncode == 0, unpack.stderr
    assert "checksums verified" in unpack.stdout
    return dest


@pytest.mark.slow
def test_pipeline_produces_a_complete_model_folder(tiny_model: Path) -> None:
    model_checks.check_files(tiny_model)
    m = model_checks.metrics(tiny_model)
    tr = m["training"]
    assert tr["steps"] >= 1 and tr["curve"]
    vocab = m["model"]["shape"]["vocab_size"]
    # It learned something: well below the loss of a uniform guess.
    assert tr["curve"][-1]["heldout_loss"] < math.log(vocab) - 0.3
    assert m["timings"]["total_s"] < BUDGET_S * 2


@pytest.mark.slow
def test_pipeline_model_runs_the_same_in_nib_and_transformers(tiny_model: Path) -> None:
    model_checks.check_nib_matches_transformers(tiny_model, n=12)


@pytest.mark.slow
def test_pipeline_model_perplexity_on_the_cpu_is_under_its_bound(tiny_model: Path) -> None:
    report, bound = model_checks.nib_heldout_perplexity(tiny_model)
    assert report.perplexity <= bound
    recorded = model_checks.metrics(tiny_model)["evaluation"]["heldout_sample"]["perplexity"]
    # The run measured on this same CPU: nib's model must agree with transformers closely.
    assert report.perplexity == pytest.approx(recorded, rel=1e-3)
