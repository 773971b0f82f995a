"""bench/common.py's result files: the header the results directory relies on (date,
device, torch, command) comes first, the benchmark's own fields after, under the
dated name bench/README.md and the tests read."""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def common(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import common as module

    monkeypatch.setattr(module, "device_name", lambda: "a test GPU (1 SMs, 1 GiB)")
    return module


def test_write_result_puts_the_header_first_and_names_the_file_by_date(
    common, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(sys, "argv", ["bench/micro_x.py", "--out", "somewhere"])
    path = common.write_result(tmp_path / "out", "micro-x", "micro_x.py", {"rows": [1, 2]})
    today = datetime.date.today().isoformat()
    assert path == tmp_path / "out" / f"{today}-micro-x.json"
    result = json.loads(path.read_text())
    assert list(result) == ["date", "device", "torch", "command", "rows"]
    assert result["date"] == today and result["device"] == "a test GPU (1 SMs, 1 GiB)"
    assert result["command"] == "python3 bench/micro_x.py --out somewhere"
    assert result["rows"] == [1, 2]
