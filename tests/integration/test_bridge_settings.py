"""The bridge's settings, its report of an unreachable server, and its recovery."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest_lsp
from lsprotocol import types
from pytest_lsp import LanguageClient

from .conftest import ServerProcess, free_port, start_server, stop_server
from .lsp_helpers import BRIDGE_CONFIG, bridge_status, initialize, inline_text, open_document


@pytest_lsp.fixture(config=BRIDGE_CONFIG)
async def client(lsp_client: LanguageClient) -> AsyncIterator[None]:
    yield
    await lsp_client.shutdown_session()


async def wait_for_message(client: LanguageClient, count: int) -> types.ShowMessageParams:
    for _ in range(500):
        if len(client.messages) >= count:
            return client.messages[count - 1]
        await asyncio.sleep(0.02)
    raise AssertionError(f"expected {count} window/showMessage, got {client.messages}")


async def test_initialization_options_in_a_section_and_bad_values_reported(
    client: LanguageClient, slow_server: ServerProcess, tmp_path: Path
) -> None:
    options = {
        "nib": {"address": slow_server.address, "maxTokens": 7, "mode": "sideways", "colour": 1}
    }
    await initialize(client, tmp_path.as_uri(), options)
    first = await wait_for_message(client, 1)
    second = await wait_for_message(client, 2)
    texts = sorted([first.message, second.message])
    assert 'setting mode is \'sideways\'; it must be "auto", "single" or "multi"' in texts[0]
    assert "unknown setting 'colour'" in texts[1]
    status = await bridge_status(client)
    assert status["max_tokens"] == 7 and status["mode"] == "auto"  # the bad one kept its default
    assert status["address"] == slow_server.address


async def test_did_change_configuration_pushed_and_pulled(
    client: LanguageClient, slow_server: ServerProcess, tmp_path: Path
) -> None:
    await initialize(client, tmp_path.as_uri(), {"address": slow_server.address})
    client.workspace_did_change_configuration(
        types.DidChangeConfigurationParams(settings={"nib": {"debounceMs": 42}})
    )
    await _until(client, "debounce_ms", 42)
    # The pull model: a notification without settings makes the bridge ask.
    client.set_configuration({"maxTokens": 9, "mode": "single"}, section="nib")
    client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings=None))
    await _until(client, "max_tokens", 9)
    assert (await bridge_status(client))["mode"] == "single"


async def _until(client: LanguageClient, key: str, value: object) -> None:
    for _ in range(200):
        if (await bridge_status(client)).get(key) == value:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"{key} never became {value}: {await bridge_status(client)}")


async def test_unreachable_server_is_reported_once_and_recovery_is_announced(
    client: LanguageClient, slow_model_dir: Path, tmp_path: Path
) -> None:
    port = free_port()
    options = {"address": f"127.0.0.1:{port}", "debounceMs": 0, "maxTokens": 4, "mode": "single"}
    await initialize(client, tmp_path.as_uri(), options)
    down = await wait_for_message(client, 1)  # the start-up check already failed
    assert down.type == types.MessageType.Warning
    assert f"cannot reach the completion server at 127.0.0.1:{port}" in down.message
    uri = (tmp_path / "a.py").as_uri()
    open_document(client, uri, "def f():\n    return 1\n")
    at = types.Position(line=1, character=12)
    assert await inline_text(client, uri, at) is None
    assert await inline_text(client, uri, at) is None
    assert len(client.messages) == 1, "the user is told once, not on every keystroke"
    assert (await bridge_status(client))["reachable"] is False

    server = start_server(slow_model_dir, tmp_path / "server.log", port=port)
    try:
        # The channel reconnects after its backoff (at most 2 s): keep typing until then.
        # (Whether the random model's single-line answer here is empty does not matter:
        # a completion that reached the server is what marks the server reachable.)
        for _ in range(50):
            await inline_text(client, uri, at)
            if (await bridge_status(client))["reachable"]:
                break
            await asyncio.sleep(0.3)
        assert (await bridge_status(client))["reachable"] is True
        back = await wait_for_message(client, 2)
        assert back.type == types.MessageType.Info
        assert f"connected to 127.0.0.1:{port} again" in back.message
        assert (await bridge_status(client))["reachable"] is True
    finally:
        stop_server(server)
