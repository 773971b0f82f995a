"""bench/replay_timing.py and bench/profiler_residue.py without a GPU: bad counts are
refused by name, each says what it needs when there is no CUDA device, and a series of
timings is summarised as the JSON records it."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def rt(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import replay_timing

    return replay_timing


@pytest.mark.parametrize("argv", [["--rounds", "0"], ["--tunings", "0"]])
def test_bad_counts_are_refused(rt, argv: list[str], capsys) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as info:
        rt.main(argv)
    assert info.value.code == 2
    assert "--rounds and --tunings must be at least 1" in capsys.readouterr().err


def test_without_a_gpu_it_says_so(rt, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(rt.torch.cuda, "is_available", lambda: False)
    assert rt.main([]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_spread_of_a_series(rt) -> None:  # type: ignore[no-untyped-def]
    assert rt.spread([3.0, 1.0, 2.0, 10.0]) == {
        "median": 2.5,
        "min": 1.0,
        "max": 10.0,
        "range": 9.0,
    }
    assert rt.MEASURES == {"launch-inclusive": False, "launch-hidden": True}


def test_profiler_residue_without_a_gpu_says_so(monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import profiler_residue

    monkeypatch.setattr(profiler_residue.torch.cuda, "is_available", lambda: False)
    assert profiler_residue.main([]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
    assert profiler_residue.STAGES == ("before", "after-one-profile", "after-two-profiles")
