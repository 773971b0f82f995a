"""The bridge with the shipped model (engine/assets/nib-tiny-code): what an editor shows is
the model's own fill-in-the-middle text, cut by the bridge's rules and nothing else."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest_lsp
from lsprotocol import types
from pytest_lsp import LanguageClient

from nib.sdk import Client

from .conftest import ServerProcess
from .lsp_helpers import BRIDGE_CONFIG, configure, initialize, inline_text, open_document

SOURCE = """import os


def read_file(path):
    with open(path) as f:
        return f.read()


def count_lines(path):
    text = read_file(path)
    return len(text.splitlines())


if __name__ == "__main__":
    print(count_lines("setup.py"))
"""


def cursor_after(marker: str) -> tuple[int, types.Position]:
    offset = SOURCE.index(marker) + len(marker)
    line = SOURCE.count("\n", 0, offset)
    column = offset - (SOURCE.rfind("\n", 0, offset) + 1)
    return offset, types.Position(line=line, character=column)


def model_infill(server: ServerProcess, offset: int, max_tokens: int, stop: list[str]) -> str:
    with Client(server.address) as client:
        return (
            client.complete(
                prefix=SOURCE[:offset],
                suffix=SOURCE[offset:],
                path="tools/lines.py",
                language="python",
                max_tokens=max_tokens,
                stop=stop,
            )
            .result()
            .text
        )


@pytest_lsp.fixture(config=BRIDGE_CONFIG)
async def editor(
    lsp_client: LanguageClient, server: ServerProcess, tmp_path: Path
) -> AsyncIterator[None]:
    options = {"address": server.address, "debounceMs": 0, "maxTokens": 48}
    await initialize(lsp_client, tmp_path.as_uri(), options)
    open_document(lsp_client, (tmp_path / "tools" / "lines.py").as_uri(), SOURCE)
    yield
    await lsp_client.shutdown_session()


async def test_single_line_ghost_text_is_the_shipped_models_infill(
    editor: LanguageClient, server: ServerProcess, tmp_path: Path
) -> None:
    offset, at = cursor_after("    text = ")  # nothing right of the cursor on a statement line
    await configure(editor, {"mode": "single"})
    text = await inline_text(editor, (tmp_path / "tools" / "lines.py").as_uri(), at)
    expected = model_infill(server, offset, 48, ["\n"])
    assert expected.strip() and "<|" not in expected
    assert text == expected


async def test_multi_line_ghost_text_is_a_cut_of_the_models_text(
    editor: LanguageClient, server: ServerProcess, tmp_path: Path
) -> None:
    offset, at = cursor_after("    text = read_file(path)\n")
    text = await inline_text(editor, (tmp_path / "tools" / "lines.py").as_uri(), at)
    raw = model_infill(server, offset, 48, [])
    # Whatever the model wrote, the bridge only cuts it: a prefix of the model's text that
    # stays in the cursor's block and carries no special-token marker.
    result = text or ""
    assert raw.startswith(result.rstrip())
    assert "<|" not in result
    for line in result.splitlines()[1:]:
        assert not line.strip() or line.startswith("    "), result
