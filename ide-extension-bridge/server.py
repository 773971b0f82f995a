"""The Language Server: textDocument/inlineCompletion (LSP 3.18 ghost text) and
textDocument/completion (for clients without inline completion), on top of the Completer.

Handlers that talk to the nib server are `async def`, so a client's
$/cancelRequest cancels their task, and with it the gRPC stream.
"""

from __future__ import annotations

import asyncio
import logging
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from lsprotocol import types
from pygls.lsp.server import LanguageServer

from nib.bridge import settings as settings_mod
from nib.bridge.completer import Completer, Suggestion
from nib.bridge.link import ServerLink
from nib.bridge.settings import BridgeSettings

log = logging.getLogger("nib.bridge")
STATUS_COMMAND = "nib.status"


def bridge_version() -> str:
    try:
        return version("nib")
    except PackageNotFoundError:
        return "0+unknown"


class NibLanguageServer(LanguageServer):
    def __init__(self, settings: BridgeSettings | None = None) -> None:
        super().__init__("nib", bridge_version())
        self.link = ServerLink(settings or BridgeSettings(), self.show)
        self.completer = Completer(self.link)
        self.pending_problems: list[str] = []
        self._tasks: set[asyncio.Task[None]] = set()

    def show(self, kind: types.MessageType, message: str) -> None:
        self.window_show_message(types.ShowMessageParams(type=kind, message=message))

    def report_problems(self, problems: list[str]) -> None:
        for problem in problems:
            self.show(types.MessageType.Warning, f"nib: {problem}")

    async def update_settings(self, raw: object) -> None:
        new, problems = settings_mod.apply(self.link.settings, raw)
        self.report_problems(problems)
        await self.link.reconfigure(new)

    def background(self, coro: Any) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def inline_items(s: Suggestion) -> types.InlineCompletionList:
    item = types.InlineCompletionItem(
        insert_text=s.text, range=types.Range(start=s.position, end=s.position)
    )
    return types.InlineCompletionList(items=[item])


def completion_items(s: Suggestion) -> types.CompletionList:
    first = s.text.strip().splitlines()[0] if s.text.strip() else s.text
    label = first if len(first) <= 60 else first[:57] + "..."
    item = types.CompletionItem(
        label=label,
        kind=types.CompletionItemKind.Snippet if s.multiline else types.CompletionItemKind.Text,
        detail="nib",
        documentation=s.text,  # plain text: every client supports it
        insert_text_format=types.InsertTextFormat.PlainText,
        text_edit=types.TextEdit(
            range=types.Range(start=s.position, end=s.position), new_text=s.text
        ),
        # Shown for whatever the user typed since the request: the client filters by it.
        filter_text=label,
        sort_text="0",
        preselect=True,
    )
    # Incomplete: the client asks again as the user types, and each answer replaces the last.
    return types.CompletionList(is_incomplete=True, items=[item])


def build_server(settings: BridgeSettings | None = None) -> NibLanguageServer:
    server = NibLanguageServer(settings)

    @server.feature(types.INITIALIZE)
    def initialize(ls: NibLanguageServer, params: types.InitializeParams) -> None:
        new, problems = settings_mod.apply(ls.link.settings, params.initialization_options)
        ls.link.settings = new
        ls.pending_problems = problems  # shown once the client is initialized

    @server.feature(types.INITIALIZED)
    def initialized(ls: NibLanguageServer, params: types.InitializedParams) -> None:
        ls.completer.root_path = ls.workspace.root_path
        ls.report_problems(ls.pending_problems)
        ls.pending_problems = []
        ls.background(ls.link.check())

    @server.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)
    async def did_change_configuration(
        ls: NibLanguageServer, params: types.DidChangeConfigurationParams
    ) -> None:
        raw: object = params.settings
        if settings_mod.section_of(raw) is None and _can_pull_configuration(ls):
            # The "pull" model: the notification is only a hint to ask.
            answers = await ls.workspace_configuration_async(
                types.ConfigurationParams(
                    items=[types.ConfigurationItem(section=settings_mod.SECTION)]
                )
            )
            raw = answers[0] if answers else None
        await ls.update_settings(raw)

    @server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
    def did_change(ls: NibLanguageServer, params: types.DidChangeTextDocumentParams) -> None:
        ls.completer.document_changed(params.text_document.uri)

    @server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(ls: NibLanguageServer, params: types.DidCloseTextDocumentParams) -> None:
        ls.completer.document_changed(params.text_document.uri)

    @server.feature(types.TEXT_DOCUMENT_INLINE_COMPLETION, types.InlineCompletionOptions())
    async def inline_completion(
        ls: NibLanguageServer, params: types.InlineCompletionParams
    ) -> types.InlineCompletionList | None:
        doc = ls.workspace.get_text_document(params.text_document.uri)
        invoked = params.context.trigger_kind == types.InlineCompletionTriggerKind.Invoked
        suggestion = await ls.completer.complete(doc, params.position, invoked=invoked)
        return inline_items(suggestion) if suggestion is not None else None

    @server.feature(types.TEXT_DOCUMENT_COMPLETION, types.CompletionOptions())
    async def completion(
        ls: NibLanguageServer, params: types.CompletionParams
    ) -> types.CompletionList | None:
        doc = ls.workspace.get_text_document(params.text_document.uri)
        # Clients send "Invoked" for typing as well as for a manual request, so
        # completion requests are always debounced.
        suggestion = await ls.completer.complete(doc, params.position)
        return completion_items(suggestion) if suggestion is not None else None

    @server.command(STATUS_COMMAND)
    def status(ls: NibLanguageServer, *args: Any) -> dict[str, Any]:
        """What the bridge knows: connection, model, and counts of what it did."""
        return {
            "address": ls.link.settings.address,
            "reachable": ls.link.reachable,
            "model": ls.link.model,
            "context_length": ls.link.context_length,
            "chars_per_token": round(ls.link.ratio.value, 3),
            "mode": ls.link.settings.mode,
            "debounce_ms": ls.link.settings.debounce_ms,
            "max_tokens": ls.link.settings.max_tokens,
            "timeout_s": ls.link.settings.timeout_s,
            "last_request_id": ls.completer.last_request_id,
            **dict(ls.completer.stats),
        }

    @server.feature(types.SHUTDOWN)
    async def shutdown(ls: NibLanguageServer, params: None) -> None:
        await ls.link.close()

    return server


def _can_pull_configuration(ls: NibLanguageServer) -> bool:
    workspace = ls.client_capabilities.workspace
    return bool(workspace is not None and workspace.configuration)
