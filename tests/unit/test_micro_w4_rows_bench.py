"""bench/micro_w4_rows.py says it needs a GPU, and exits 2, where there is none."""

from __future__ import annotations

import sys

import pytest

from tests.bench_modules import load_bench

torch = pytest.importorskip("torch")


def test_refuses_without_a_gpu(monkeypatch: pytest.MonkeyPatch, capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    mw = load_bench("micro_w4_rows")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(sys, "argv", ["micro_w4_rows.py", "--out", str(tmp_path)])
    assert mw.main() == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
