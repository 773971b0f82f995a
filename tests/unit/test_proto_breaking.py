"""`make lint` runs `buf breaking` against the last released proto; it must pass
now and must catch a breaking edit."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUF = Path(sys.executable).parent / "buf"


def released_image() -> Path:
    makefile = (ROOT / "Makefile").read_text()
    match = re.search(r"^PROTO_RELEASED \?= (\S+)$", makefile, re.MULTILINE)
    assert match, "Makefile names no PROTO_RELEASED image"
    return ROOT / match.group(1)


def buf_breaking(workdir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BUF), "breaking", "--against", str(released_image())],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def proto_copy(tmp_path: Path) -> Path:
    if not BUF.exists():
        pytest.fail(f"buf is not installed next to {sys.executable} (pip install buf-bin)")
    shutil.copy(ROOT / "buf.yaml", tmp_path / "buf.yaml")
    (tmp_path / "proto" / "nib" / "v1").mkdir(parents=True)
    shutil.copy(
        ROOT / "proto" / "nib" / "v1" / "completion.proto",
        tmp_path / "proto" / "nib" / "v1" / "completion.proto",
    )
    return tmp_path


def test_current_proto_is_compatible_with_the_release(proto_copy: Path) -> None:
    result = buf_breaking(proto_copy)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_renumbered_field_is_caught(proto_copy: Path) -> None:
    proto = proto_copy / "proto" / "nib" / "v1" / "completion.proto"
    text = proto.read_text()
    assert "bool logprobs = 9;" in text
    proto.write_text(text.replace("bool logprobs = 9;", "bool logprobs = 19;"))
    result = buf_breaking(proto_copy)
    assert result.returncode != 0
    assert "logprobs" in result.stdout + result.stderr
