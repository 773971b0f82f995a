"""Keyword arguments become a CompleteRequest here, and nowhere else."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import TypedDict

from nib.v1 import completion_pb2 as pb


class CompletionParams(TypedDict, total=False):
    """The keyword arguments every `complete()` accepts (besides prompt/prefix/suffix)."""

    path: str
    language: str
    max_tokens: int
    temperature: float
    top_k: int
    top_p: float
    seed: int | None
    stop: Sequence[str]
    logprobs: bool
    request_id: str | None


def build_request(
    prompt: str | None = None,
    *,
    prefix: str | None = None,
    suffix: str | None = None,
    path: str = "",
    language: str = "",
    max_tokens: int = 0,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 0.0,
    seed: int | None = None,
    stop: Sequence[str] = (),
    logprobs: bool = False,
    request_id: str | None = None,
) -> pb.CompleteRequest:
    """A CompleteRequest; give exactly one of `prompt` or `prefix`/`suffix`.

    Values the server would reject (too many tokens, a temperature out of
    range) are left for it to reject: it knows its limits, and its
    InvalidArgument names the field and the limit.
    """
    if (prompt is None) == (prefix is None and suffix is None):
        raise ValueError("give either prompt, or prefix and/or suffix (fill-in-the-middle)")
    if isinstance(stop, str):
        raise TypeError("stop is a sequence of strings; wrap a single stop string in a list")
    if max_tokens < 0 or top_k < 0:
        raise ValueError("max_tokens and top_k must not be negative")
    if seed is not None and seed < 0:
        raise ValueError(f"seed is {seed}; must not be negative")
    req = pb.CompleteRequest(
        max_tokens=max_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        stop=list(stop),
        logprobs=logprobs,
        request_id=request_id or uuid.uuid4().hex,
    )
    if prompt is not None:
        req.prompt = prompt
    else:
        req.infill.CopyFrom(
            pb.Infill(prefix=prefix or "", suffix=suffix or "", path=path, language=language)
        )
    if seed is not None:
        req.seed = seed
    return req
