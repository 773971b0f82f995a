"""bench/micro_w4_rows.py on the GPU: every multi-row config (one-row config at m = 1)
runs on both activation sources, its outputs (poisoned before each run) match the fp32
reference, and both timings come back, on a small layer with two weight copies."""

from __future__ import annotations

import math

import pytest
import torch

from tests.bench_modules import load_bench

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("m", [1, 3, 16])
def test_every_config_on_both_sources(m: int, monkeypatch: pytest.MonkeyPatch) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from nib.engine.cuda import loader
    from nib.engine.cuda.w4a16 import MULTI_ROW, ONE_ROW, CudaInt4, runs_on

    why = loader.unavailable_reason(torch.device("cuda"))
    if why:
        pytest.skip(why)
    mw = load_bench("micro_w4_rows")
    monkeypatch.setattr(mw, "copies", lambda nbytes: 2)
    k, n = 2048, 384  # 16 groups: splits of 2 and 4 run
    rows = mw.time_layer(k, n, m)
    probe = CudaInt4(
        torch.zeros(n, k, dtype=torch.uint8, device="cuda"),
        torch.ones(k // 128, n, dtype=torch.float16, device="cuda"),
        None,
    )
    expected = {
        probe.effective(c, m).label()
        for c in (ONE_ROW if m == 1 else MULTI_ROW)
        if runs_on(probe.effective(c, m), probe.capability)
    }
    assert {r["config"] for r in rows} == expected
    for r in rows:
        assert r["m"] == m
        for src in ("distinct", "one-row"):
            assert math.isfinite(r[f"{src}_us"]) and r[f"{src}_us"] > 0, r
            assert r[f"{src}_rel_err"] <= 1e-3, r
