"""From a cursor in a document to the text to insert: debounce, prompt, stream, stop, cancel.

One completion is in flight at a time (an editor has one cursor): a newer
request replaces it, an edit of its document cancels it, and a client's
$/cancelRequest cancels the handler's task, which cancels the gRPC stream.
Each cancel reaches the server on the session stream and stops the
generation within one decode step.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import Counter
from dataclasses import dataclass, field

from lsprotocol import types
from pygls.workspace import TextDocument

from nib.bridge.context import fim_window, prompt_token_budget
from nib.bridge.link import DEFAULT_CONTEXT_LENGTH, ServerLink
from nib.bridge.stops import StopRules, Truncator
from nib.sdk import AsyncSessionStream, FinishReason, InvalidArgument, NibError

log = logging.getLogger("nib.bridge")


@dataclass
class Job:
    """One completion in flight."""

    uri: str
    stream: AsyncSessionStream | None = None
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True
        if self.stream is not None:
            self.stream.cancel()


@dataclass
class Suggestion:
    text: str
    position: types.Position
    multiline: bool
    request_id: str


@dataclass
class Completer:
    link: ServerLink
    root_path: str | None = None
    stats: Counter[str] = field(default_factory=Counter)
    # The id of the latest completion sent: the server logs it with each request.
    last_request_id: str | None = None
    _seq: int = 0
    _job: Job | None = None

    def document_changed(self, uri: str) -> None:
        """An edit (or close) makes a completion for the old text useless: cancel it."""
        job = self._job
        if job is not None and job.uri == uri and not job.cancelled:
            job.cancel()
            self.stats["cancelled_by_edit"] += 1

    async def complete(
        self, doc: TextDocument, position: types.Position, *, invoked: bool = False
    ) -> Suggestion | None:
        self._seq += 1
        seq, version = self._seq, doc.version
        if self._job is not None and not self._job.cancelled:
            self._job.cancel()  # the user moved on; the session also supersedes it
            self.stats["replaced"] += 1
        settings = self.link.settings
        if settings.debounce_ms and not invoked:
            await asyncio.sleep(settings.debounce_ms / 1000)
            if seq != self._seq or doc.version != version:
                self.stats["debounced"] += 1
                return None
        job = Job(doc.uri)
        self._job = job
        try:
            return await self._run(job, doc, position)
        except asyncio.CancelledError:
            self.stats["cancelled_by_client"] += 1
            raise
        finally:
            if self._job is job:
                self._job = None

    def _relative_path(self, doc: TextDocument) -> str:
        path = doc.path
        if self.root_path and path.startswith(self.root_path.rstrip(os.sep) + os.sep):
            return os.path.relpath(path, self.root_path)
        return os.path.basename(path)

    async def _run(
        self, job: Job, doc: TextDocument, position: types.Position
    ) -> Suggestion | None:
        settings = self.link.settings
        try:
            context_length = await self.link.model_context()
        except NibError as exc:
            self.link.failed(exc)
            context_length = DEFAULT_CONTEXT_LENGTH  # try anyway: the server may be back
        path = self._relative_path(doc)
        offset = doc.offset_at_position(position)
        budget = prompt_token_budget(
            settings.prompt_tokens, context_length, settings.max_tokens, len(path)
        )
        for attempt in (1, 2):
            window = fim_window(
                doc.source, offset, self.link.ratio.chars_for(budget), settings.prefix_share
            )
            rules = StopRules.for_window(window, settings.mode)
            if job.cancelled:
                return None
            stream = self.link.session().complete(
                prefix=window.prefix,
                suffix=window.suffix,
                path=path,
                language=doc.language_id or "",
                max_tokens=settings.max_tokens,
                temperature=settings.temperature,
                stop=() if rules.multiline else ("\n",),
                timeout=settings.timeout_s,
            )
            job.stream = stream
            self.last_request_id = stream.request_id
            self.stats["started"] += 1
            truncator = Truncator(rules)
            try:
                async for delta in stream:
                    if truncator.feed(delta):
                        stream.cancel()  # the rest is not wanted: stop the server now
                        break
            except InvalidArgument as exc:
                if attempt == 1 and self.link.ratio.too_long(window.chars, exc.message):
                    log.info(
                        "prompt too long; retrying with %.2f chars/token", self.link.ratio.value
                    )
                    continue
                log.warning("completion rejected: %s", exc)
                return None
            except NibError as exc:
                self.link.failed(exc)
                return None
            self.link.connected()
            if stream.usage.prompt_tokens:
                self.link.ratio.observe(window.chars, stream.usage.prompt_tokens)
            if job.cancelled or (
                stream.finish_reason in (FinishReason.CANCELLED, FinishReason.SUPERSEDED)
                and not truncator.stopped
            ):
                return None
            self.stats["completed"] += 1
            text = truncator.result()
            if not text.strip():
                return None
            return Suggestion(text, position, rules.multiline, stream.request_id)
        return None
