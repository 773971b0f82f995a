"""One Session stream: starts and cancels come in, deltas and dones go out.

A reader task takes client messages; each admitted completion gets a pump task
that forwards its events to `out`, which the RPC handler yields from. A start
supersedes whatever the session is running (the old completion ends with
FINISH_REASON_SUPERSEDED; the engine lets go of it within one decode step, and
the new one is queued at once). A start that cannot run ends at once with a
Done carrying FINISH_REASON_ERROR and the status code it would have had; the
session lives on. When the server drains, the session ends (UNAVAILABLE) as
soon as nothing of it is running.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
import structlog

from nib.engine.aio import coalesce
from nib.engine.errors import EngineError, InvalidRequest
from nib.engine.request import DoneEvent
from nib.service import convert
from nib.service.errors import code_number, status_for
from nib.service.ledger import Caller, CancelCause, Ledger, Tracked
from nib.v1 import completion_pb2 as pb

log = structlog.get_logger("nib.service")


class End(enum.Enum):
    """Items on `out` that end the stream instead of being sent."""

    OK = "ok"  # the client half-closed and everything has finished
    DRAINED = "drained"  # the server is shutting down and nothing runs


Out = pb.SessionResponse | End | BaseException


def _same_delta_stream(first: Out, item: Out) -> bool:
    """item continues first's text: both deltas of the same completion."""
    return (
        isinstance(first, pb.SessionResponse)
        and isinstance(item, pb.SessionResponse)
        and item.WhichOneof("event") == "delta"
        and item.request_id == first.request_id
    )


def _join_deltas(items: list[Out]) -> Out:
    first = items[0]
    assert isinstance(first, pb.SessionResponse)
    joined = pb.SessionResponse()
    joined.CopyFrom(first)
    for item in items[1:]:
        assert isinstance(item, pb.SessionResponse)
        joined.delta.text += item.delta.text
        joined.delta.token_ids.extend(item.delta.token_ids)
        joined.delta.logprobs.extend(item.delta.logprobs)
    return joined


@dataclass
class _Running:
    tracked: Tracked
    pump: asyncio.Task[None]


class SessionStream:
    def __init__(self, ledger: Ledger, caller: Caller) -> None:
        self.ledger = ledger
        self.caller = caller
        self.out: asyncio.Queue[Out] = asyncio.Queue()
        self._held: Out | None = None  # taken off `out` by coalescing, sent next
        self.running: dict[str, _Running] = {}
        self.latest: str | None = None
        self.draining = False
        self.cause: CancelCause = "client_gone"  # why the stream ended, if gRPC ended it

    async def next_out(self) -> Out:
        """The next item to send. A delta comes joined with the deltas of the same
        completion already waiting behind it (engine/aio.py coalesce()): when the stream
        falls behind, it catches up in fewer messages; nothing waits for company."""
        item = self._held if self._held is not None else await self.out.get()
        self._held = None
        if isinstance(item, pb.SessionResponse) and item.WhichOneof("event") == "delta":
            item, self._held = coalesce(item, self.out, _same_delta_stream, _join_deltas)
        return item

    async def read(self, requests: AsyncIterator[pb.SessionRequest]) -> None:
        try:
            async for message in requests:
                action = message.WhichOneof("action")
                if action == "start":
                    await self._start(message.start)
                elif action == "cancel":
                    self._cancel(message.cancel.request_id)
                else:
                    self._reject("", InvalidRequest("action", "one of start or cancel is required"))
            # The client half-closed: finish what runs, then end the stream.
            await asyncio.gather(*(r.pump for r in list(self.running.values())))
            self.out.put_nowait(End.OK)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # reading failed: end the stream with the error
            self.out.put_nowait(exc)

    async def _start(self, request: pb.CompleteRequest) -> None:
        for running in self.running.values():
            running.tracked.cancel("superseded")
        if request.request_id in self.running:
            exc = InvalidRequest("request_id", "is already used by a running completion")
            self.ledger.rejected(request.request_id, self.caller, status_for(exc), str(exc))
            self._reject(request.request_id, exc)
            return
        try:
            tracked = await self.ledger.open(request, self.caller, lambda: self.cause)
        except EngineError as exc:
            self._reject(request.request_id, exc)
            return
        self.latest = tracked.request_id
        self.running[tracked.request_id] = _Running(
            tracked, asyncio.create_task(self._pump(tracked))
        )

    def _reject(self, request_id: str, exc: EngineError) -> None:
        done = convert.error_done(str(exc), code_number(status_for(exc)))
        self.out.put_nowait(pb.SessionResponse(request_id=request_id, done=done))
        self._end_if_drained()

    def _cancel(self, request_id: str) -> None:
        rid = request_id or self.latest
        running = self.running.get(rid or "")
        log.debug("cancel received", target=rid, running=running is not None)
        if running is not None:
            running.tracked.cancel("request")

    async def _pump(self, tracked: Tracked) -> None:
        # A task of its own, hence a context of its own: bind without resetting.
        structlog.contextvars.bind_contextvars(request_id=tracked.request_id)
        log.debug("admitted", prompt_tokens=tracked.completion.prompt_tokens)
        rid = tracked.request_id
        try:
            async for event in tracked.events():
                if isinstance(event, DoneEvent):
                    code, message = tracked.outcome()
                    done = (
                        convert.done_to_pb(event)
                        if code is grpc.StatusCode.OK
                        else convert.error_done(message, code_number(code), event)
                    )
                    self.out.put_nowait(pb.SessionResponse(request_id=rid, done=done))
                else:
                    delta, _ = convert.event_to_pb(event)
                    self.out.put_nowait(pb.SessionResponse(request_id=rid, delta=delta))
        finally:
            self.running.pop(rid, None)
            tracked.release()
            self._end_if_drained()

    def on_drain(self) -> None:
        self.draining = True
        self._end_if_drained()

    def _end_if_drained(self) -> None:
        if self.draining and not self.running:
            self.out.put_nowait(End.DRAINED)

    async def close(self, cause: CancelCause) -> None:
        """The stream ended (client gone, deadline, done): cancel what still runs."""
        for running in list(self.running.values()):
            running.tracked.release(cause)
            running.pump.cancel()
        for running in list(self.running.values()):
            with contextlib.suppress(asyncio.CancelledError):
                await running.pump
