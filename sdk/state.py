"""What every completion stream accumulates, whichever RPC and whichever client carries it."""

from __future__ import annotations

import time

import grpc

from nib.sdk.errors import NibError, error_for, from_code, from_rpc_error, rpc_code
from nib.sdk.retry import RetryPolicy, should_retry
from nib.sdk.types import Completion, FinishReason, Timings, Usage
from nib.v1 import completion_pb2 as pb

_FINISH: dict[int, FinishReason] = {
    pb.FINISH_REASON_LENGTH: FinishReason.LENGTH,
    pb.FINISH_REASON_STOP: FinishReason.STOP,
    pb.FINISH_REASON_END_OF_TEXT: FinishReason.END_OF_TEXT,
    pb.FINISH_REASON_CANCELLED: FinishReason.CANCELLED,
    pb.FINISH_REASON_SUPERSEDED: FinishReason.SUPERSEDED,
    pb.FINISH_REASON_ERROR: FinishReason.ERROR,
}

# A CompleteResponse or a SessionResponse: both carry a delta or a done.
Response = pb.CompleteResponse | pb.SessionResponse


class StreamState:
    """The text so far and, once done, finish reason, usage and timings.

    `text` grows as deltas arrive; `finish_reason` is None until the
    completion ended (then `done` is True).
    """

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.text = ""
        self.token_ids: list[int] = []
        self.logprobs: list[float] = []
        self.finish_reason: FinishReason | None = None
        self.stop = ""
        self.usage = Usage()
        self.timings = Timings()
        self.attempts = 1  # calls made for this completion (more than 1 after retries)
        self.received = False  # anything arrived: from here on, no retry
        self.cancelled = False  # the caller cancelled (break, close, cancel())
        self._started = time.perf_counter()
        self.first_delta_s: float | None = None  # client-side time to the first text
        # Client side: time.perf_counter() when each token's delta was taken in, one entry
        # per token id, whether or not it brought text (tokens inside a UTF-8 character,
        # re-generated healed text or a possible stop string arrive with text "").
        self.token_times: list[float] = []
        # Delta messages with token ids taken in: fewer than the tokens where the server
        # joined tokens that waited behind a stream that fell behind (one time stamp).
        self.token_deltas = 0

    def _backoff_or_raise(
        self, retry: RetryPolicy, exc: grpc.RpcError, remaining: float | None
    ) -> float:
        """Seconds to wait before the next attempt after exc; raises exc's NibError when
        the policy says not to retry (every client and RPC decides the same way)."""
        delay = retry.backoff(self.attempts)
        if not should_retry(
            retry,
            rpc_code(exc),
            attempts=self.attempts,
            received=self.received,
            delay=delay,
            remaining=remaining,
        ):
            raise from_rpc_error(exc) from None
        return delay

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def _apply(self, response: Response) -> str:
        """Take one response in; return its new text ('' for none). Raises for an error Done."""
        self.received = True
        if response.HasField("delta"):
            d = response.delta
            if d.token_ids:
                self.token_deltas += 1
                self.token_times += [time.perf_counter()] * len(d.token_ids)
            self.token_ids.extend(d.token_ids)
            self.logprobs.extend(d.logprobs)
            if d.text:
                if self.first_delta_s is None:
                    self.first_delta_s = time.perf_counter() - self._started
                self.text += d.text
            return d.text
        if response.HasField("done"):
            error = self._record_done(response.done)
            if error is not None:
                raise error
        return ""

    def _record_done(self, done: pb.Done) -> NibError | None:
        self.stop = done.stop
        u, t = done.usage, done.timings
        self.usage = Usage(u.prompt_tokens, u.completion_tokens, u.cached_prompt_tokens)
        self.timings = Timings(
            t.queue_ms, t.ttft_ms, t.total_ms, tuple(t.inter_token_ms), t.arrival_unix_ms
        )
        if self.finish_reason is None:
            self.finish_reason = _FINISH.get(done.finish_reason, FinishReason.UNSPECIFIED)
        if done.finish_reason == pb.FINISH_REASON_ERROR:
            return from_code(done.error_code or grpc.StatusCode.INTERNAL.value[0], done.error)
        return None

    def _mark_cancelled(self) -> bool:
        """True if this call did cancel (the stream was still running)."""
        if self.done:
            return False
        self.cancelled = True
        self.finish_reason = FinishReason.CANCELLED
        return True

    def _ended_without_done(self) -> NibError:
        return error_for(grpc.StatusCode.INTERNAL, "the server ended the stream without a done")

    def _check_iterable(self) -> None:
        if getattr(self, "_iterated", False):
            raise RuntimeError("a completion stream can be iterated only once")
        self._iterated = True

    def _result(self) -> Completion:
        assert self.finish_reason is not None
        return Completion(
            request_id=self.request_id,
            text=self.text,
            finish_reason=self.finish_reason,
            usage=self.usage,
            timings=self.timings,
            stop=self.stop,
            token_ids=tuple(self.token_ids),
        )

    def __repr__(self) -> str:
        state = self.finish_reason or "running"
        return f"<{type(self).__name__} {self.request_id} {state} {self.text[-40:]!r}>"
