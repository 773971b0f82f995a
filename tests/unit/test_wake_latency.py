"""bench/wake_latency.py on this machine: every transport answers, rows and summary agree,
and the result file carries the results directory's header."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_the_probe_times_each_transport_with_and_without_spinners(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import wake_latency

    argv = ["--iters", "60", "--rounds", "2", "--spin", "0,1", "--idle-ms", "0,1"]
    argv += ["--transport", "pipe", "--transport", "thread", "--out", str(tmp_path)]
    monkeypatch.setattr(sys, "argv", ["bench/wake_latency.py", *argv])
    assert wake_latency.main(argv) == 0
    (path,) = tmp_path.glob("*-wake-latency.json")
    result = json.loads(path.read_text())
    assert list(result)[:4] == ["date", "device", "torch", "command"]
    assert result["command"] == "python3 bench/wake_latency.py " + " ".join(argv)
    assert "cores" in result["device"] and result["host"]["spin_policy"]
    rows = result["rows"]
    # 2 rounds x 2 spinner counts x 2 transports x 2 idle times.
    assert len(rows) == 16
    for row in rows:
        assert 0 < row["median_us"] <= row["p90_us"] <= row["p99_us"]
        assert row["iters"] == (60 if row["idle_ms"] == 0 else 50)
    assert set(result["summary"]) == {
        f"{t}_spin{c}_idle{i}_median_us" for t in ("pipe", "thread") for c in (0, 1) for i in (0, 1)
    }
    # The sleep before an idle round trip is not inside its time (a round trip here is µs).
    assert all(r["median_us"] < 1000 for r in rows)
