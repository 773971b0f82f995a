"""Driving the real bridge (`nib lsp`) with pytest-lsp's client."""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from typing import Any

from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient

BRIDGE_COMMAND = [sys.executable, "-m", "nib.sdk.cli", "lsp", "--log-level", "INFO"]
# pytest-lsp's server_env replaces the environment rather than extending it.
BRIDGE_CONFIG = ClientServerConfig(server_command=BRIDGE_COMMAND, server_env=dict(os.environ))

CAPABILITIES = types.ClientCapabilities(
    workspace=types.WorkspaceClientCapabilities(configuration=True),
    text_document=types.TextDocumentClientCapabilities(
        inline_completion=types.InlineCompletionClientCapabilities(),
        completion=types.CompletionClientCapabilities(),
    ),
)


async def initialize(
    client: LanguageClient, root_uri: str, options: dict[str, Any]
) -> types.InitializeResult:
    return await client.initialize_session(
        types.InitializeParams(
            capabilities=CAPABILITIES, root_uri=root_uri, initialization_options=options
        )
    )


def open_document(client: LanguageClient, uri: str, text: str, language: str = "python") -> None:
    client.text_document_did_open(
        types.DidOpenTextDocumentParams(
            text_document=types.TextDocumentItem(
                uri=uri, language_id=language, version=1, text=text
            )
        )
    )


def edit(client: LanguageClient, uri: str, version: int, at: types.Position, text: str) -> None:
    """Insert `text` at `at`, as a keystroke does."""
    client.text_document_did_change(
        types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
            content_changes=[
                types.TextDocumentContentChangePartial(
                    range=types.Range(start=at, end=at), text=text
                )
            ],
        )
    )


def inline_params(
    uri: str, position: types.Position, *, invoked: bool = True
) -> types.InlineCompletionParams:
    kind = (
        types.InlineCompletionTriggerKind.Invoked
        if invoked
        else types.InlineCompletionTriggerKind.Automatic
    )
    return types.InlineCompletionParams(
        text_document=types.TextDocumentIdentifier(uri=uri),
        position=position,
        context=types.InlineCompletionContext(trigger_kind=kind),
    )


async def inline_text(client: LanguageClient, uri: str, position: types.Position) -> str | None:
    result = await client.text_document_inline_completion_async(inline_params(uri, position))
    if result is None:
        return None
    items = result.items if isinstance(result, types.InlineCompletionList) else result
    assert len(items) == 1
    text = items[0].insert_text
    assert isinstance(text, str)
    return text


def send_inline(
    client: LanguageClient, uri: str, position: types.Position, *, invoked: bool = True
) -> tuple[str, Any]:
    """Send an inline completion request without waiting; (its id, its future)."""
    msg_id = uuid.uuid4().hex
    # A task, so that the request is on its way before this returns.
    future = asyncio.ensure_future(
        client.protocol.send_request_async(
            types.TEXT_DOCUMENT_INLINE_COMPLETION,
            inline_params(uri, position, invoked=invoked),
            msg_id=msg_id,
        )
    )
    return msg_id, future


def cancel_request(client: LanguageClient, msg_id: str) -> None:
    client.protocol.notify(types.CANCEL_REQUEST, types.CancelParams(id=msg_id))


async def bridge_status(client: LanguageClient) -> dict[str, Any]:
    result = await client.workspace_execute_command_async(
        types.ExecuteCommandParams(command="nib.status")
    )
    assert isinstance(result, dict)
    return result


async def configure(client: LanguageClient, settings: dict[str, object]) -> None:
    client.workspace_did_change_configuration(
        types.DidChangeConfigurationParams(settings={"nib": settings})
    )
    for _ in range(100):  # a notification has no answer: wait until the status shows it
        status = await bridge_status(client)
        if all(status.get(_STATUS_KEY.get(k, k)) == v for k, v in settings.items()):
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"settings {settings} never applied: {status}")


_STATUS_KEY = {"maxTokens": "max_tokens", "debounceMs": "debounce_ms", "timeoutS": "timeout_s"}
