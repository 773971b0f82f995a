"""The LSP bridge end to end: pytest-lsp's client <-> `nib lsp` <-> a real nib server.

What the bridge answers is checked against what the SDK gets from the server
for the same fill-in-the-middle prompt (greedy decoding is deterministic), so
the test sees the served model's own text, not a made-up one.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_lsp
from lsprotocol import types
from pygls.exceptions import JsonRpcRequestCancelled
from pytest_lsp import LanguageClient

from nib.bridge.stops import SPECIAL_MARKER
from nib.sdk import Client

from .conftest import ServerProcess, assert_cancelled_on_server, assert_engine_free
from .lsp_helpers import (
    BRIDGE_CONFIG,
    bridge_status,
    cancel_request,
    configure,
    edit,
    initialize,
    inline_text,
    open_document,
    send_inline,
)

SOURCE = "import os\n\n\ndef read(path):\n    with open(path) as f:\n        data = f.read()\n\nprint(read('x'))\n"
# 1000 tokens take a minute or more on the test model; the deadline is longer still, so
# only a cancel can end such a completion within seconds.
LONG = {"mode": "multi", "maxTokens": 1000, "debounceMs": 0, "timeoutS": 300}


@pytest_lsp.fixture(config=BRIDGE_CONFIG)
async def bridge(
    lsp_client: LanguageClient, slow_server: ServerProcess, tmp_path: Path
) -> AsyncIterator[None]:
    options = {"address": slow_server.address, "debounceMs": 0, "maxTokens": 16, "mode": "single"}
    await initialize(lsp_client, tmp_path.as_uri(), options)
    yield
    await lsp_client.shutdown_session()


def doc_uri(tmp_path: Path) -> str:
    return (tmp_path / "pkg" / "reader.py").as_uri()


def expected_single_line(slow_server: ServerProcess, text: str, offset: int) -> str:
    """The server's own greedy single-line infill for this cursor, through the SDK."""
    with Client(slow_server.address) as client:
        result = client.complete(
            prefix=text[:offset],
            suffix=text[offset:],
            path="pkg/reader.py",
            language="python",
            max_tokens=16,
            stop=["\n"],
        ).result()
    # The bridge also ends a completion at a FIM/document marker (see stops.py).
    text = SPECIAL_MARKER.split(result.text, maxsplit=1)[0]
    assert text.strip(), "pick another cursor: the model's answer here is blank"
    return text


@pytest_lsp.fixture(config=BRIDGE_CONFIG)
async def uninitialized_bridge(lsp_client: LanguageClient) -> AsyncIterator[None]:
    yield
    await lsp_client.shutdown_session()


async def test_advertises_inline_completion_and_completion(
    uninitialized_bridge: LanguageClient, slow_server: ServerProcess, tmp_path: Path
) -> None:
    result = await initialize(
        uninitialized_bridge, tmp_path.as_uri(), {"address": slow_server.address}
    )
    caps = result.capabilities
    assert caps.inline_completion_provider is not None
    assert caps.completion_provider is not None
    assert caps.execute_command_provider is not None
    assert "nib.status" in caps.execute_command_provider.commands
    sync = caps.text_document_sync
    assert isinstance(sync, types.TextDocumentSyncOptions)
    assert sync.change == types.TextDocumentSyncKind.Incremental and sync.open_close


async def test_inline_completion_is_the_models_infill(
    bridge: LanguageClient, slow_server: ServerProcess, tmp_path: Path
) -> None:
    uri = doc_uri(tmp_path)
    open_document(bridge, uri, SOURCE)
    line, col = 5, len("        data = f.read()")  # end of the line: nothing right of the cursor
    offset = SOURCE.index("f.read()") + len("f.read()")
    text = await inline_text(bridge, uri, types.Position(line=line, character=col))
    assert text == expected_single_line(slow_server, SOURCE, offset)
    status = await bridge_status(bridge)
    assert status["reachable"] is True and status["completed"] == 1


async def test_completion_request_gets_the_same_text(
    bridge: LanguageClient, slow_server: ServerProcess, tmp_path: Path
) -> None:
    uri = doc_uri(tmp_path)
    open_document(bridge, uri, SOURCE)
    offset = SOURCE.index("f.read()") + len("f.read()")
    result = await bridge.text_document_completion_async(
        types.CompletionParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            position=types.Position(line=5, character=len("        data = f.read()")),
        )
    )
    assert isinstance(result, types.CompletionList) and result.is_incomplete
    (item,) = result.items
    assert item.text_edit is not None
    assert item.text_edit.new_text == expected_single_line(slow_server, SOURCE, offset)


async def test_cancel_request_stops_the_generation_on_the_server(
    bridge: LanguageClient, slow_server: ServerProcess, tmp_path: Path
) -> None:
    uri = doc_uri(tmp_path)
    open_document(bridge, uri, SOURCE + "\n")
    await configure(bridge, LONG)
    msg_id, answer = send_inline(bridge, uri, types.Position(line=9, character=0))
    await asyncio.sleep(1.0)  # the generation runs: 1000 tokens take seconds here
    cancel_request(bridge, msg_id)
    with pytest.raises(JsonRpcRequestCancelled):
        await asyncio.wait_for(answer, 3)
    with Client(slow_server.address) as client:
        assert_engine_free(client)
    status = await bridge_status(bridge)
    assert status["cancelled_by_client"] == 1 and status["started"] == 1
    assert_cancelled_on_server(slow_server, status["last_request_id"], "request")


async def test_an_edit_cancels_the_completion_in_flight(
    bridge: LanguageClient, slow_server: ServerProcess, tmp_path: Path
) -> None:
    uri = doc_uri(tmp_path)
    open_document(bridge, uri, SOURCE + "\n")
    await configure(bridge, LONG)
    _, answer = send_inline(bridge, uri, types.Position(line=9, character=0))
    await asyncio.sleep(1.0)
    edit(bridge, uri, 2, types.Position(line=9, character=0), "x")
    assert await asyncio.wait_for(answer, 3) is None
    with Client(slow_server.address) as client:
        assert_engine_free(client)
    status = await bridge_status(bridge)
    assert status["cancelled_by_edit"] == 1
    assert_cancelled_on_server(slow_server, status["last_request_id"], "request")


async def test_a_newer_request_supersedes_the_older(
    bridge: LanguageClient, slow_server: ServerProcess, tmp_path: Path
) -> None:
    uri = doc_uri(tmp_path)
    open_document(bridge, uri, SOURCE + "\n")
    await configure(bridge, LONG)
    _, older = send_inline(bridge, uri, types.Position(line=9, character=0))
    await asyncio.sleep(1.0)
    older_id = (await bridge_status(bridge))["last_request_id"]
    await configure(bridge, {"mode": "single", "maxTokens": 16})
    newer = await inline_text(bridge, uri, types.Position(line=5, character=23))
    assert await asyncio.wait_for(older, 3) is None
    offset = SOURCE.index("f.read()") + len("f.read()")
    assert newer == expected_single_line(slow_server, SOURCE + "\n", offset)
    status = await bridge_status(bridge)
    assert status["replaced"] == 1 and status["started"] == 2
    # Both the bridge's cancel and the session's supersession stop it; the first wins.
    assert_cancelled_on_server(slow_server, older_id, "request", "superseded")
    with Client(slow_server.address) as client:
        assert_engine_free(client)


async def test_a_burst_of_keystrokes_makes_one_request(
    bridge: LanguageClient, tmp_path: Path
) -> None:
    uri = doc_uri(tmp_path)
    open_document(bridge, uri, SOURCE)
    await configure(bridge, {"debounceMs": 300})
    answers = []
    for i, ch in enumerate("value"):
        at = types.Position(line=6, character=i)
        edit(bridge, uri, 2 + i, at, ch)
        after = types.Position(line=6, character=i + 1)
        answers.append(send_inline(bridge, uri, after, invoked=False)[1])
        await asyncio.sleep(0.03)  # typing faster than the debounce
    results = await asyncio.wait_for(asyncio.gather(*answers), 60)
    assert results[:-1] == [None] * 4
    status = await bridge_status(bridge)
    assert status["started"] == 1 and status["debounced"] == 4


async def test_a_long_document_is_cut_to_fit_the_models_context(
    bridge: LanguageClient, tmp_path: Path
) -> None:
    lines = [f"value_{i:04d} = compute({i})\n" for i in range(400)]  # 10 000 characters
    uri = (tmp_path / "long.py").as_uri()
    open_document(bridge, uri, "".join(lines))
    at = types.Position(line=200, character=len(lines[200]) - 1)
    await inline_text(bridge, uri, at)
    status = await bridge_status(bridge)
    # The first prompt (2.5 chars per token guessed) was too long for this byte-level
    # model; the server said how long, and the bridge cut it and asked again.
    assert (status["started"], status["completed"]) == (2, 1)
    assert status["chars_per_token"] < 1.0
    await inline_text(bridge, uri, at)
    status = await bridge_status(bridge)
    assert (status["started"], status["completed"]) == (3, 2), "learned: no second rejection"
