"""Every completion the service runs, from admission to its one log event.

The Ledger admits completions (validation, tokenising, queueing), remembers the
ones in flight so that a shutdown can drain and then cancel them, and records
each exactly once when it ends: one structlog event and the metrics. A
completion whose RPC went away before its end (client gone, deadline) is
followed to its DoneEvent by a reaper task, so the record also says how long
the engine took to let go of it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import statistics
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Literal, Protocol

import grpc
import structlog

from nib.engine.aio import Completion
from nib.engine.engine import Engine
from nib.engine.errors import EngineError, EngineUnavailable
from nib.engine.request import DoneEvent, Event, FinishReason
from nib.service import convert
from nib.service.errors import status_for
from nib.service.metrics import Metrics
from nib.v1 import completion_pb2 as pb

log = structlog.get_logger("nib.service")

CancelCause = Literal["request", "superseded", "client_gone", "deadline", "shutdown"]
# How long a reaper waits for the engine to end a request nobody reads any more.
REAP_TIMEOUT_S = 60.0
# Threads that tokenise prompts off the event loop: a fixed number, started up front,
# so that tokenising never competes with more than this much of the engine's CPU and
# the server's thread count does not drift with load.
TOKENIZER_THREADS = 2
# Prompts up to this many characters are tokenised on the event loop (about 1 ms at
# most); longer ones on the tokenizer threads, so one huge prompt cannot stall
# every other stream.
INLINE_TOKENIZE_CHARS = 4096
SHUTDOWN_MESSAGE = "server is shutting down: generation cancelled at the end of the drain period"
CAUSE_STATUS: dict[str, grpc.StatusCode] = {
    "client_gone": grpc.StatusCode.CANCELLED,
    "deadline": grpc.StatusCode.DEADLINE_EXCEEDED,
    "shutdown": grpc.StatusCode.UNAVAILABLE,
}


@dataclass(frozen=True)
class Caller:
    method: str  # "Complete" or "Session"
    tenant: str
    session: str = ""


class Drainable(Protocol):
    def on_drain(self) -> None: ...


class Tracked:
    """One admitted completion: its events, why it was cancelled, how it ended."""

    def __init__(self, ledger: Ledger, completion: Completion, caller: Caller) -> None:
        self._ledger = ledger
        self.completion = completion
        self.request_id = completion.request_id
        self.caller = caller
        self.cause: CancelCause | None = None
        self.done: DoneEvent | None = None
        self._cancelled_at: float | None = None
        self._done_at: float | None = None
        self._released = False

    def cancel(self, cause: CancelCause) -> None:
        """Stop it (the engine stops within one step); the first cause given is kept."""
        if self.done is not None or self.cause is not None:
            return
        self.cause = cause
        self._cancelled_at = time.perf_counter()
        reason = FinishReason.SUPERSEDED if cause == "superseded" else FinishReason.CANCELLED
        self.completion.cancel(reason)

    async def events(self) -> AsyncIterator[Event]:
        async for event in self.completion:
            if isinstance(event, DoneEvent):
                self.done = event
                self._done_at = time.perf_counter()
                self._ledger.record(self)
            yield event

    def outcome(self) -> tuple[grpc.StatusCode, str]:
        """The status this completion ends with, and a message if it is not OK."""
        done = self.done
        stopped = done is None or done.finish_reason in (
            FinishReason.CANCELLED,
            FinishReason.SUPERSEDED,
        )
        if stopped and self.cause == "shutdown":
            return grpc.StatusCode.UNAVAILABLE, SHUTDOWN_MESSAGE
        if stopped and self.cause == "client_gone":
            return grpc.StatusCode.CANCELLED, "the call was cancelled"
        if stopped and self.cause == "deadline":
            return grpc.StatusCode.DEADLINE_EXCEEDED, "the call's deadline passed"
        if done is not None and done.finish_reason is FinishReason.ERROR:
            return status_for(done.cause), done.error
        return grpc.StatusCode.OK, ""

    @property
    def cancel_to_done_ms(self) -> float | None:
        if self._cancelled_at is None or self._done_at is None:
            return None
        return (self._done_at - self._cancelled_at) * 1e3

    def release(self, cause: CancelCause = "client_gone") -> None:
        """The RPC stops reading: cancel if still running and follow it to its end."""
        if self._released:
            return
        self._released = True
        if self.done is None:
            self.cancel(cause)
            self._ledger.reap(self)


class Ledger:
    def __init__(self, engine: Engine, limits: convert.Limits, metrics: Metrics) -> None:
        self.engine = engine
        self.limits = limits
        self.metrics = metrics
        self.draining = False
        self.sessions: set[Drainable] = set()
        self._open: set[Tracked] = set()
        self._reapers: set[asyncio.Task[None]] = set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._tokenizer = concurrent.futures.ThreadPoolExecutor(
            TOKENIZER_THREADS, thread_name_prefix="nib-tokenize"
        )
        started = threading.Barrier(TOKENIZER_THREADS + 1)
        for _ in range(TOKENIZER_THREADS):
            self._tokenizer.submit(started.wait)
        started.wait()

    def close(self) -> None:
        self._tokenizer.shutdown(wait=False, cancel_futures=True)

    @property
    def inflight(self) -> int:
        return len(self._open)

    async def open(
        self,
        request: pb.CompleteRequest,
        caller: Caller,
        why_cancelled: Callable[[], CancelCause] = lambda: "client_gone",
    ) -> Tracked:
        """Admit a completion; EngineError (recorded as a rejection) if it cannot run.
        If the call ends while the prompt is being tokenised, that is recorded too,
        with the status `why_cancelled()` names."""
        request_id = request.request_id
        try:
            if self.draining:
                raise EngineUnavailable("server is shutting down")
            if not self.engine.ready.is_set() and self.engine.failure is None:
                raise EngineUnavailable("engine is warming up; watch health for SERVING")
            spec = convert.spec_from_pb(request, self.limits)
            request_id = spec.request_id
            prompt = spec.prompt
            size = len(prompt.text or "") + len(prompt.prefix) + len(prompt.suffix)
            # Tokenising reuses the session's last prompt (engine SessionTokens), kept per
            # tenant: a session id alone never reaches another tenant's text.
            tokens_key = f"{caller.tenant}\x00{caller.session}" if caller.session else ""
            if size > INLINE_TOKENIZE_CHARS and tokens_key:
                size = self.engine.fresh_prompt_bytes(prompt, tokens_key)  # what is left
            if size <= INLINE_TOKENIZE_CHARS:
                # A typical editor prompt tokenises in ~0.3 ms: cheaper on the loop than
                # the ~0.3 ms round trip to a tokenizer thread, on the time to first token.
                ids = self.engine.encode_prompt(prompt, tokens_key)
            else:
                loop = asyncio.get_running_loop()
                ids = await loop.run_in_executor(
                    self._tokenizer, self.engine.encode_prompt, prompt, tokens_key
                )
            completion = Completion(self.engine, ids, spec.params, spec.request_id, caller.session)
        except EngineError as exc:
            self.rejected(request_id, caller, status_for(exc), str(exc))
            raise
        except asyncio.CancelledError:
            cause = why_cancelled()
            message = f"the call ended ({cause}) before the request was admitted"
            self.rejected(
                request_id, caller, CAUSE_STATUS.get(cause, grpc.StatusCode.CANCELLED), message
            )
            raise
        tracked = Tracked(self, completion, caller)
        self._open.add(tracked)
        self._idle.clear()
        self.metrics.inflight.set(len(self._open))
        return tracked

    def rejected(
        self, request_id: str, caller: Caller, code: grpc.StatusCode, message: str
    ) -> None:
        """The record of a request that never ran."""
        self.metrics.requests.labels(caller.method, caller.tenant, code.name).inc()
        log.info(
            "request",
            request_id=request_id,
            session=caller.session,
            method=caller.method,
            tenant=caller.tenant,
            code=code.name,
            error=message,
        )

    def record(self, t: Tracked) -> None:
        """The one log event and the metrics of an admitted completion (once)."""
        if t not in self._open:
            return
        self._open.discard(t)
        self.metrics.inflight.set(len(self._open))
        if not self._open:
            self._idle.set()
        code, message = t.outcome()
        m, tenant = self.metrics, t.caller.tenant
        m.requests.labels(t.caller.method, tenant, code.name).inc()
        fields: dict[str, object] = {
            "request_id": t.request_id,
            "session": t.caller.session,
            "method": t.caller.method,
            "tenant": tenant,
            "code": code.name,
        }
        done = t.done
        if done is not None:
            u, tm = done.usage, done.timings
            m.finished.labels(tenant, done.finish_reason.value).inc()
            m.queue_wait.observe(tm.queue_ms / 1e3)
            if u.completion_tokens:
                m.generated_tokens.labels(tenant).inc(u.completion_tokens)
                m.ttft.observe(tm.ttft_ms / 1e3)
            for gap in tm.inter_token_ms:
                m.inter_token.observe(gap / 1e3)
            fields.update(
                finish_reason=done.finish_reason.value,
                prompt_tokens=u.prompt_tokens,
                completion_tokens=u.completion_tokens,
                queue_ms=round(tm.queue_ms, 3),
                ttft_ms=round(tm.ttft_ms, 3),
                total_ms=round(tm.total_ms, 3),
            )
            if tm.inter_token_ms:
                fields["itl_median_ms"] = round(statistics.median(tm.inter_token_ms), 3)
                fields["itl_max_ms"] = round(max(tm.inter_token_ms), 3)
            if t.cause is not None and done.finish_reason in (
                FinishReason.CANCELLED,
                FinishReason.SUPERSEDED,
            ):
                if t.cause == "superseded":
                    m.supersessions.labels(tenant).inc()
                else:
                    m.cancellations.labels(tenant, t.cause).inc()
        if t.cause is not None:
            fields["cancel_cause"] = t.cause
            if (ms := t.cancel_to_done_ms) is not None:
                fields["cancel_to_done_ms"] = round(ms, 3)
        if message:
            fields["error"] = message
        level = logging.ERROR if code is grpc.StatusCode.INTERNAL else logging.INFO
        log.log(level, "request", **fields)

    def reap(self, t: Tracked) -> None:
        task = asyncio.create_task(self._reap(t))
        self._reapers.add(task)
        task.add_done_callback(self._reapers.discard)

    async def _reap(self, t: Tracked) -> None:
        try:
            async with asyncio.timeout(REAP_TIMEOUT_S):
                async for _ in t.events():
                    pass
        except TimeoutError:
            log.error("engine did not end the request", request_id=t.request_id)
            self.record(t)

    def start_draining(self) -> None:
        """Admit nothing new; tell open sessions (they end once idle)."""
        self.draining = True
        for session in list(self.sessions):
            session.on_drain()

    def cancel_all(self, cause: CancelCause) -> int:
        running = list(self._open)
        for t in running:
            t.cancel(cause)
        return len(running)

    async def wait_idle(self, within_s: float) -> bool:
        """True once nothing is in flight (every completion recorded), False on timeout."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(within_s):
                await self._idle.wait()
        return self._idle.is_set()
