"""bench/micro_w4_rows.py on a CPU: it says it needs a GPU (exit 2), and refuses unknown
activation sources and row counts outside 1..16 by name."""

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


BAD_ARGS = [
    ("--sources", v, "--sources: a comma-separated subset of")
    for v in ("", "distinct,strided", "one_row")
]
BAD_ARGS += [
    ("--ms", v, "--ms: comma-separated row counts from 1 to 16")
    for v in ("", "0", "17", "4,x", "16,,1")
]


@pytest.mark.parametrize(("flag", "value", "message"), BAD_ARGS)
def test_bad_arguments_are_refused_by_name(
    monkeypatch: pytest.MonkeyPatch, capsys, flag: str, value: str, message: str
) -> None:  # type: ignore[no-untyped-def]
    """Unknown activation sources and row counts outside 1..16, before any GPU work."""
    mw = load_bench("micro_w4_rows")
    monkeypatch.setattr(sys, "argv", ["micro_w4_rows.py", flag, value])
    with pytest.raises(SystemExit) as exc:
        mw.main()
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
