"""What goes into the engine and what comes out: plain dataclasses, no protobuf."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from nib.engine.errors import EngineError


class FinishReason(enum.Enum):
    LENGTH = "length"
    STOP = "stop"
    END_OF_TEXT = "end_of_text"
    CANCELLED = "cancelled"
    SUPERSEDED = "superseded"
    ERROR = "error"


# The smallest temperature the samplers divide by. A request may ask for any temperature
# above 0 (the service takes 0..MAX_TEMPERATURE); below this one the scaled logits of a
# real model overflow fp32 (logit / 1e-38 is inf, and the softmax of infinities is NaN),
# while at it sampling is already indistinguishable from greedy unless two logits tie
# within ~1e-5.
MIN_SAMPLING_TEMPERATURE = 1e-6


@dataclass(frozen=True)
class GenerationParams:
    max_tokens: int = 64
    temperature: float = 0.0  # 0: greedy
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1: off
    seed: int | None = None  # None: random
    stop: tuple[str, ...] = ()
    logprobs: bool = False

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    @property
    def sampling_temperature(self) -> float:
        """What a sampler divides the logits by (never below MIN_SAMPLING_TEMPERATURE)."""
        return max(self.temperature, MIN_SAMPLING_TEMPERATURE)


@dataclass(frozen=True)
class Prompt:
    """Either plain text or a fill-in-the-middle cursor."""

    text: str | None = None
    prefix: str = ""
    suffix: str = ""
    path: str = ""
    language: str = ""

    @property
    def is_infill(self) -> bool:
        return self.text is None


@dataclass(frozen=True)
class TokenEvent:
    """Text produced by one or more tokens (text may be empty, see IncrementalDetokenizer)."""

    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...] = ()


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_prompt_tokens: int = 0


@dataclass(frozen=True)
class Timings:
    queue_ms: float = 0.0
    ttft_ms: float = 0.0
    total_ms: float = 0.0
    inter_token_ms: tuple[float, ...] = ()
    # The arrival on the Unix clock (ms), which the other figures count from.
    arrival_unix_ms: float = 0.0


def unix_ms(stamp: float) -> float:
    """A time.perf_counter() stamp on the Unix clock, in milliseconds."""
    return (time.time() - (time.perf_counter() - stamp)) * 1e3


@dataclass(frozen=True)
class DoneEvent:
    finish_reason: FinishReason
    usage: Usage = field(default_factory=Usage)
    timings: Timings = field(default_factory=Timings)
    stop: str = ""
    error: str = ""
    # For FinishReason.ERROR: the engine error behind it, when it is one the
    # caller can act on (EngineUnavailable: the engine died or stopped). None
    # for an unexpected failure of this one request.
    cause: EngineError | None = None


Event = TokenEvent | DoneEvent
