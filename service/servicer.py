"""The CompletionService handlers: Complete (one-shot stream), Session (bidi), GetModelInfo,
GetHealthDetail."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator

import grpc
import structlog

from nib.engine.engine import Engine
from nib.engine.request import DoneEvent
from nib.service import convert, health_detail
from nib.service.auth import current_tenant
from nib.service.ledger import Caller, CancelCause, Ledger
from nib.service.session import End, SessionStream
from nib.service.telemetry import Telemetry
from nib.v1 import completion_pb2 as pb
from nib.v1 import completion_pb2_grpc as pb_grpc

SESSION_ID_HEADER = "nib-session-id"
MAX_SESSION_ID = 128


def client_session(context: grpc.aio.ServicerContext) -> str:
    """The session id the client sent in its metadata (printable, bounded), or ""."""
    for key, value in context.invocation_metadata() or ():
        if key == SESSION_ID_HEADER and isinstance(value, str):
            return value[:MAX_SESSION_ID] if value.isprintable() else ""
    return ""


log = structlog.get_logger("nib.service")
DEADLINE_MARGIN_S = 0.02
DEADLINE_MARGIN_FRACTION = 0.1


def cancel_cause(context: grpc.aio.ServicerContext, budget_s: float | None = None) -> CancelCause:
    """Why gRPC cancelled the handler: its deadline passed, or the client went away.

    The margin: the server's deadline counts from when the request arrived, so the
    client's own deadline timer, which cancels the call, fires a transit time before
    the handler's clock says the deadline passed; on a loaded machine that transit
    exceeded 20 ms (tests/integration saw deadlines reported as clients that went
    away). A cancel with at most DEADLINE_MARGIN_S, or DEADLINE_MARGIN_FRACTION of
    the call's budget (budget_s: its time remaining when the handler started), left
    counts as the deadline: a client that really leaves that late is counted so too."""
    remaining = context.time_remaining()
    if remaining is None:
        return "client_gone"
    margin = max(DEADLINE_MARGIN_S, DEADLINE_MARGIN_FRACTION * (budget_s or 0.0))
    return "deadline" if remaining <= margin else "client_gone"


class CompletionServicer(pb_grpc.CompletionServiceServicer):  # type: ignore[misc]
    def __init__(
        self,
        engine: Engine,
        ledger: Ledger,
        server_version: str,
        telemetry: Telemetry | None = None,
    ) -> None:
        self.engine = engine
        self.ledger = ledger
        self.server_version = server_version
        self.telemetry = telemetry or Telemetry(engine, interval_s=0)

    async def Complete(
        self, request: pb.CompleteRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.CompleteResponse]:
        # A client may name its editing session (the same header Session answers with):
        # the engine then keeps that session's prompt prefix cached across calls.
        session_id = client_session(context)
        budget = context.time_remaining()
        tracked = await self.ledger.open(
            request,
            Caller("Complete", current_tenant(), session_id),
            lambda: cancel_cause(context, budget),
        )
        rid = tracked.request_id
        structlog.contextvars.bind_contextvars(request_id=rid)
        log.debug("admitted", prompt_tokens=tracked.completion.prompt_tokens)
        try:
            async for event in tracked.events():
                if isinstance(event, DoneEvent):
                    code, message = tracked.outcome()
                    if code is not grpc.StatusCode.OK:
                        await context.abort(code, message)
                    yield pb.CompleteResponse(request_id=rid, done=convert.done_to_pb(event))
                else:
                    delta, _ = convert.event_to_pb(event)
                    yield pb.CompleteResponse(request_id=rid, delta=delta)
        except (asyncio.CancelledError, GeneratorExit):
            # gRPC ends a handler either by cancelling its task or, when the call ended
            # while the handler waited at a yield, by closing this generator.
            tracked.release(cancel_cause(context, budget))
            raise
        finally:
            tracked.release()

    async def Session(
        self, requests: AsyncIterator[pb.SessionRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.SessionResponse]:
        session_id = client_session(context) or uuid.uuid4().hex[:16]
        budget = context.time_remaining()
        structlog.contextvars.bind_contextvars(session=session_id)
        log.debug("session opened")
        await context.send_initial_metadata(((SESSION_ID_HEADER, session_id),))
        session = SessionStream(self.ledger, Caller("Session", current_tenant(), session_id))
        self.ledger.sessions.add(session)
        self.ledger.metrics.sessions.inc()
        if self.ledger.draining:
            session.on_drain()
        reader = asyncio.create_task(session.read(requests))
        cause: CancelCause = "client_gone"
        try:
            while True:
                item = await session.next_out()
                if item is End.OK:
                    break
                if item is End.DRAINED:
                    await context.abort(grpc.StatusCode.UNAVAILABLE, "server is shutting down")
                if isinstance(item, BaseException):
                    raise item
                assert isinstance(item, pb.SessionResponse)
                yield item
        except (asyncio.CancelledError, GeneratorExit):  # see Complete
            cause = session.cause = cancel_cause(context, budget)
            raise
        finally:
            self.ledger.sessions.discard(session)
            self.ledger.metrics.sessions.dec()
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
            await session.close(cause)

    async def GetModelInfo(
        self, request: pb.GetModelInfoRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetModelInfoResponse:
        return convert.model_info_to_pb(self.engine.info(), self.server_version)

    async def GetHealthDetail(
        self, request: pb.GetHealthDetailRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetHealthDetailResponse:
        return health_detail.build(
            self.engine,
            self.telemetry,
            draining=self.ledger.draining,
            server_version=self.server_version,
        )
