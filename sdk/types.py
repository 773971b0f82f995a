"""Plain Python results of the SDK: no protobuf leaks to callers."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class FinishReason(enum.StrEnum):
    """Why a completion ended. A str, so `reason == "length"` works too."""

    LENGTH = "length"  # max_tokens generated, or the context is full
    STOP = "stop"  # a stop string was generated (see `stop`)
    END_OF_TEXT = "end_of_text"  # the model ended the text
    CANCELLED = "cancelled"  # the caller cancelled it
    SUPERSEDED = "superseded"  # a newer completion on the same session replaced it
    ERROR = "error"  # the server failed it (raised as a NibError)
    UNSPECIFIED = "unspecified"  # the server sent none (a protocol bug)


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_prompt_tokens: int = 0


@dataclass(frozen=True)
class Timings:
    """Server-side timings in milliseconds."""

    queue_ms: float = 0.0
    ttft_ms: float = 0.0
    total_ms: float = 0.0
    inter_token_ms: tuple[float, ...] = ()
    # When the server took the request, in ms since the Unix epoch by its clock (0:
    # unknown); with the figures above it places each token on that clock.
    arrival_unix_ms: float = 0.0


@dataclass(frozen=True)
class Completion:
    """A finished completion, as `stream.result()` returns it."""

    request_id: str
    text: str
    finish_reason: FinishReason
    usage: Usage
    timings: Timings
    stop: str = ""
    token_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class ModelInfo:
    model: str
    architecture: str
    context_length: int
    vocab_size: int
    device: str
    dtype: str
    quantization: str
    max_tokens_limit: int
    supports_infill: bool
    server_version: str
    graphs: tuple[tuple[str, bool, bool], ...] = field(default_factory=tuple)
    # Prompt-lookup drafting of greedy completions: draft tokens per verify step (0:
    # off), and what each verify step length costs in decode steps (GPU; measured).
    speculative_k: int = 0
    verify_costs: tuple[tuple[int, float], ...] = field(default_factory=tuple)
