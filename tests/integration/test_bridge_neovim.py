"""A real editor as the client: headless Neovim (Debian's package) attaches `nib lsp`,
asks for a completion, and gets the shipped model's text."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from nib.sdk import Client

from .conftest import ServerProcess
from .lsp_helpers import BRIDGE_COMMAND

SCRIPT = Path(__file__).resolve().parent / "neovim" / "complete.lua"
SOURCE = (
    "import os\n\n\ndef read_file(path):\n    with open(path) as f:\n        return f.read()\n"
    "\n\ndef count_lines(path):\n    text = \n    return len(text.splitlines())\n"
)

pytestmark = pytest.mark.skipif(
    shutil.which("nvim") is None,
    reason="Neovim is not installed; `make test` installs it (apt-get install neovim) "
    "where it runs as root with apt",
)


def test_neovim_gets_a_completion_from_the_bridge(server: ServerProcess, tmp_path: Path) -> None:
    source = tmp_path / "reader.py"
    source.write_text(SOURCE)
    line, character = 9, len("    text = ")
    out = tmp_path / "answer.json"
    env = {
        **os.environ,
        "NIB_LSP_CMD": json.dumps(BRIDGE_COMMAND),
        "NIB_ADDRESS": server.address,
        "NIB_FILE": str(source),
        "NIB_LINE": str(line),
        "NIB_CHARACTER": str(character),
        "NIB_OUT": str(out),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),  # no user configuration
        "XDG_DATA_HOME": str(tmp_path / "data"),
        "XDG_STATE_HOME": str(tmp_path / "state"),
    }
    run = subprocess.run(
        ["nvim", "--headless", "-u", "NONE", "-c", "filetype on", "-c", f"luafile {SCRIPT}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.exists(), f"Neovim wrote nothing (exit {run.returncode}): {run.stderr}"
    answer = json.loads(out.read_text())
    assert "error" not in answer, answer
    assert answer["filetype"] == "python"
    (item,) = answer["result"]["items"]
    offset = SOURCE.index("    text = ") + len("    text = ")
    with Client(server.address) as client:
        expected = client.complete(
            prefix=SOURCE[:offset],
            suffix=SOURCE[offset:],
            path="reader.py",
            language="python",
            max_tokens=16,
            stop=["\n"],
        ).result()
    assert expected.text.strip()
    assert item["textEdit"]["newText"] == expected.text
    assert item["textEdit"]["range"]["start"] == {"line": line, "character": character}
