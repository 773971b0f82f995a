"""The CompletionService handlers: Complete (one-shot stream) and Session (bidi)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc

from nib.engine.aio import Completion
from nib.engine.engine import Engine
from nib.engine.errors import EngineError
from nib.engine.request import FinishReason
from nib.service import convert
from nib.service.errors import status_for
from nib.v1 import completion_pb2 as pb
from nib.v1 import completion_pb2_grpc as pb_grpc

log = logging.getLogger("nib.service")


class CompletionServicer(pb_grpc.CompletionServiceServicer):  # type: ignore[misc]
    def __init__(self, engine: Engine, limits: convert.Limits, server_version: str) -> None:
        self.engine = engine
        self.limits = limits
        self.server_version = server_version

    async def open_completion(self, request: pb.CompleteRequest) -> Completion:
        spec = convert.spec_from_pb(request, self.limits)
        ids = await asyncio.to_thread(self.engine.encode_prompt, spec.prompt)
        return Completion(self.engine, ids, spec.params, spec.request_id)

    async def Complete(
        self, request: pb.CompleteRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.CompleteResponse]:
        completion = await self.open_completion(request)
        # Leaving this block early (client gone, deadline) cancels the generation.
        async with completion:
            async for event in completion:
                delta, done = convert.event_to_pb(event)
                yield pb.CompleteResponse(request_id=completion.request_id, delta=delta, done=done)

    async def Session(
        self, requests: AsyncIterator[pb.SessionRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.SessionResponse]:
        session = _Session(self)
        reader = asyncio.create_task(session.read(requests))
        try:
            while (item := await session.out.get()) is not None:
                yield item
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
            await session.close()

    async def GetModelInfo(
        self, request: pb.GetModelInfoRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetModelInfoResponse:
        return convert.model_info_to_pb(self.engine.info(), self.server_version)


@dataclass
class _Running:
    completion: Completion
    pump: asyncio.Task[None]


@dataclass
class _Session:
    """State of one Session stream: a reader task feeds starts/cancels in, pumps
    forward each completion's events to `out`; None on `out` ends the stream."""

    servicer: CompletionServicer
    out: asyncio.Queue[pb.SessionResponse | None] = field(default_factory=asyncio.Queue)
    running: dict[str, _Running] = field(default_factory=dict)
    latest: str | None = None

    async def read(self, requests: AsyncIterator[pb.SessionRequest]) -> None:
        try:
            async for message in requests:
                action = message.WhichOneof("action")
                if action == "start":
                    await self._start(message.start)
                elif action == "cancel":
                    self._cancel(message.cancel.request_id)
            # The client half-closed: finish what runs, then end the stream.
            await asyncio.gather(*(r.pump for r in list(self.running.values())))
        finally:
            self.out.put_nowait(None)

    async def _start(self, request: pb.CompleteRequest) -> None:
        for running in self.running.values():
            running.completion.cancel(FinishReason.SUPERSEDED)
        if request.request_id in self.running:
            self._reject(request.request_id, "request_id: already used by a running completion", 3)
            return
        try:
            completion = await self.servicer.open_completion(request)
        except EngineError as exc:
            code = status_for(exc) or grpc.StatusCode.INTERNAL
            self._reject(request.request_id, str(exc), code.value[0])
            return
        self.latest = completion.request_id
        self.running[completion.request_id] = _Running(
            completion, asyncio.create_task(self._pump(completion))
        )

    def _reject(self, request_id: str, message: str, code: int) -> None:
        """A start that cannot run ends at once with an error; the session lives on."""
        done = convert.error_done(message, code)
        self.out.put_nowait(pb.SessionResponse(request_id=request_id, done=done))

    def _cancel(self, request_id: str) -> None:
        rid = request_id or self.latest
        if rid is not None and rid in self.running:
            self.running[rid].completion.cancel(FinishReason.CANCELLED)

    async def _pump(self, completion: Completion) -> None:
        try:
            async with completion:
                async for event in completion:
                    delta, done = convert.event_to_pb(event)
                    self.out.put_nowait(
                        pb.SessionResponse(request_id=completion.request_id, delta=delta, done=done)
                    )
        finally:
            self.running.pop(completion.request_id, None)

    async def close(self) -> None:
        """The stream ended (client gone or done): cancel everything still running."""
        for running in list(self.running.values()):
            running.completion.cancel(FinishReason.CANCELLED)
            running.pump.cancel()
        for running in list(self.running.values()):
            with contextlib.suppress(asyncio.CancelledError):
                await running.pump
