"""The committed gRPC stubs are exactly what the generator writes from proto/."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parents[2] / "tools"


def test_committed_stubs_match_proto() -> None:
    pytest.importorskip("grpc_tools")
    sys.path.insert(0, str(TOOLS))
    try:
        from gen_proto import drift
    finally:
        sys.path.remove(str(TOOLS))
    assert drift() == []


def test_drift_is_detected(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools")
    sys.path.insert(0, str(TOOLS))
    try:
        from gen_proto import PROTO_ROOT, drift
    finally:
        sys.path.remove(str(TOOLS))
    stale = tmp_path / "nib" / "v1"
    stale.mkdir(parents=True)
    for f in (PROTO_ROOT / "nib" / "v1").glob("*_pb2*.py*"):
        (stale / f.name).write_text(f.read_text())
    (stale / "completion_pb2.py").write_text("# edited by hand\n")
    assert any("completion_pb2.py" in p for p in drift(tmp_path))
