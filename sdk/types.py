"""Plain Python results of the SDK: no protobuf leaks to callers."""

from __future__ import annotations

from dataclasses import dataclass, field


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
