"""bench/micro_w4_rows.py on a CPU: it says it needs a GPU (exit 2), and refuses unknown
activation sources by name."""

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


@pytest.mark.parametrize("sources", ["", "distinct,strided", "one_row"])
def test_unknown_sources_are_refused_by_name(
    monkeypatch: pytest.MonkeyPatch, capsys, sources: str
) -> None:  # type: ignore[no-untyped-def]
    mw = load_bench("micro_w4_rows")
    monkeypatch.setattr(sys, "argv", ["micro_w4_rows.py", "--sources", sources])
    with pytest.raises(SystemExit) as exc:
        mw.main()
    assert exc.value.code == 2
    assert "--sources" in capsys.readouterr().err


@pytest.mark.parametrize("ms", ["", "0", "17", "4,x", "16,,1"])
def test_row_counts_out_of_range_are_refused_by_name(
    monkeypatch: pytest.MonkeyPatch, capsys, ms: str
) -> None:  # type: ignore[no-untyped-def]
    mw = load_bench("micro_w4_rows")
    monkeypatch.setattr(sys, "argv", ["micro_w4_rows.py", "--ms", ms])
    with pytest.raises(SystemExit) as exc:
        mw.main()
    assert exc.value.code == 2
    assert "--ms: comma-separated row counts from 1 to 16" in capsys.readouterr().err
