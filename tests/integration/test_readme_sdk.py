"""The Python snippets of the README's SDK section run, as written, against the real server."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ServerProcess

README = Path(__file__).resolve().parents[2] / "README.md"


def sdk_snippets() -> list[str]:
    text = README.read_text()
    section = text[text.index("## Using the SDK") : text.index("## The wire contract")]
    return re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)


def test_the_section_has_snippets() -> None:
    assert len(sdk_snippets()) >= 3


@pytest.mark.parametrize("index", range(3))
def test_snippet_runs(slow_server: ServerProcess, index: int) -> None:
    code = sdk_snippets()[index].replace("127.0.0.1:50051", slow_server.address)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip()
