"""Protobuf stops here: requests become engine dataclasses, events become messages."""

from __future__ import annotations

import math
import uuid
from dataclasses import asdict, dataclass

from nib.engine.engine import ModelInfo
from nib.engine.errors import InvalidRequest
from nib.engine.kernel_paths import KernelPath
from nib.engine.request import DoneEvent, Event, FinishReason, GenerationParams, Prompt
from nib.engine.versions import Versions
from nib.v1 import completion_pb2 as pb

MAX_STOP_STRINGS = 16
MAX_STOP_LENGTH = 256
MAX_REQUEST_ID_LENGTH = 128
MAX_TEMPERATURE = 2.0
MAX_PATH_LENGTH = 1024
MAX_LANGUAGE_LENGTH = 64

FINISH_TO_PB = {
    FinishReason.LENGTH: pb.FINISH_REASON_LENGTH,
    FinishReason.STOP: pb.FINISH_REASON_STOP,
    FinishReason.END_OF_TEXT: pb.FINISH_REASON_END_OF_TEXT,
    FinishReason.CANCELLED: pb.FINISH_REASON_CANCELLED,
    FinishReason.SUPERSEDED: pb.FINISH_REASON_SUPERSEDED,
    FinishReason.ERROR: pb.FINISH_REASON_ERROR,
}


@dataclass(frozen=True)
class Limits:
    max_tokens_limit: int
    default_max_tokens: int
    vocab_size: int | None = None  # top_k above it is rejected; None: not checked


@dataclass(frozen=True)
class CompletionSpec:
    request_id: str
    prompt: Prompt
    params: GenerationParams


def spec_from_pb(req: pb.CompleteRequest, limits: Limits) -> CompletionSpec:
    """Validate a CompleteRequest; InvalidRequest names the field and the limit."""
    which = req.WhichOneof("input")
    if which is None:
        raise InvalidRequest("prompt", "one of prompt or infill is required")
    if which == "prompt":
        if not req.prompt:
            raise InvalidRequest("prompt", "must not be empty")
        prompt = Prompt(text=req.prompt)
    else:
        fill = req.infill
        if not fill.prefix and not fill.suffix:
            raise InvalidRequest("infill", "prefix and suffix must not both be empty")
        if len(fill.path) > MAX_PATH_LENGTH:
            raise InvalidRequest(
                "infill.path", f"is {len(fill.path)} characters; at most {MAX_PATH_LENGTH} allowed"
            )
        if len(fill.language) > MAX_LANGUAGE_LENGTH:
            raise InvalidRequest(
                "infill.language",
                f"is {len(fill.language)} characters; at most {MAX_LANGUAGE_LENGTH} allowed",
            )
        prompt = Prompt(
            prefix=fill.prefix, suffix=fill.suffix, path=fill.path, language=fill.language
        )

    max_tokens = req.max_tokens or limits.default_max_tokens
    if max_tokens > limits.max_tokens_limit:
        raise InvalidRequest(
            "max_tokens", f"is {max_tokens}; must be at most {limits.max_tokens_limit}"
        )
    if not (math.isfinite(req.temperature) and 0.0 <= req.temperature <= MAX_TEMPERATURE):
        raise InvalidRequest(
            "temperature", f"is {req.temperature}; must be between 0 and {MAX_TEMPERATURE}"
        )
    if limits.vocab_size is not None and req.top_k > limits.vocab_size:
        raise InvalidRequest(
            "top_k", f"is {req.top_k}; must be at most the vocabulary size {limits.vocab_size}"
        )
    if not (math.isfinite(req.top_p) and 0.0 <= req.top_p <= 1.0):
        raise InvalidRequest("top_p", f"is {req.top_p}; must be between 0 and 1")
    if len(req.stop) > MAX_STOP_STRINGS:
        raise InvalidRequest(
            "stop", f"has {len(req.stop)} strings; at most {MAX_STOP_STRINGS} allowed"
        )
    for s in req.stop:
        if not s or len(s) > MAX_STOP_LENGTH:
            raise InvalidRequest(
                "stop", f"each stop string must be 1 to {MAX_STOP_LENGTH} characters"
            )
    if len(req.request_id) > MAX_REQUEST_ID_LENGTH:
        raise InvalidRequest("request_id", f"must be at most {MAX_REQUEST_ID_LENGTH} characters")
    if req.request_id and not req.request_id.isprintable():
        raise InvalidRequest("request_id", "must be printable text")

    params = GenerationParams(
        max_tokens=max_tokens,
        temperature=req.temperature,
        top_k=req.top_k,
        top_p=req.top_p if 0.0 < req.top_p < 1.0 else 1.0,
        seed=req.seed if req.HasField("seed") else None,
        stop=tuple(req.stop),
        logprobs=req.logprobs,
    )
    return CompletionSpec(req.request_id or uuid.uuid4().hex, prompt, params)


def done_to_pb(event: DoneEvent) -> pb.Done:
    t, u = event.timings, event.usage
    return pb.Done(
        finish_reason=FINISH_TO_PB[event.finish_reason],
        stop=event.stop,
        usage=pb.Usage(
            prompt_tokens=u.prompt_tokens,
            completion_tokens=u.completion_tokens,
            cached_prompt_tokens=u.cached_prompt_tokens,
        ),
        timings=pb.Timings(
            queue_ms=t.queue_ms,
            ttft_ms=t.ttft_ms,
            total_ms=t.total_ms,
            inter_token_ms=t.inter_token_ms,
            arrival_unix_ms=t.arrival_unix_ms,
        ),
        error=event.error,
    )


def error_done(message: str, code: int, event: DoneEvent | None = None) -> pb.Done:
    """A Done for a completion that failed (with its usage and timings, if it ran)."""
    done = done_to_pb(event) if event is not None else pb.Done()
    done.finish_reason = pb.FINISH_REASON_ERROR
    done.stop = ""
    done.error = message
    done.error_code = code
    return done


def event_to_pb(event: Event) -> tuple[pb.Delta | None, pb.Done | None]:
    """(delta, done) of a response message carrying event; exactly one is set."""
    if isinstance(event, DoneEvent):
        return None, done_to_pb(event)
    return pb.Delta(text=event.text, token_ids=event.token_ids, logprobs=event.logprobs), None


def model_info_to_pb(info: ModelInfo, server_version: str) -> pb.GetModelInfoResponse:
    return pb.GetModelInfoResponse(
        model=info.model,
        architecture=info.architecture,
        context_length=info.context_length,
        vocab_size=info.vocab_size,
        device=info.device,
        dtype=info.dtype,
        quantization=info.quantization,
        max_tokens_limit=info.max_tokens_limit,
        supports_infill=info.supports_infill,
        graphs=[pb.GraphInfo(name=n, ready=r, fallback=f) for n, r, f in info.graphs],
        server_version=server_version,
        versions=versions_to_pb(info.versions) if info.versions else None,
        kernel_paths=kernel_paths_to_pb(info.kernel_paths),
        speculation=pb.Speculation(
            draft_tokens=info.speculative_k,
            verify_costs=[pb.VerifyCost(tokens=t, decode_steps=c) for t, c in info.verify_costs],
        ),
    )


def versions_to_pb(v: Versions) -> pb.Versions:
    return pb.Versions(**asdict(v))


def kernel_paths_to_pb(paths: tuple[KernelPath, ...]) -> list[pb.KernelPath]:
    return [pb.KernelPath(**asdict(p)) for p in paths]
