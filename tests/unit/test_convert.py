"""Request validation at the service edge names the field and the limit."""

from __future__ import annotations

import math

import pytest

from nib.engine.errors import InvalidRequest
from nib.service.convert import Limits, spec_from_pb
from nib.v1 import completion_pb2 as pb

LIMITS = Limits(max_tokens_limit=256, default_max_tokens=32, vocab_size=300)


@pytest.mark.parametrize(
    ("request_kwargs", "field", "detail"),
    [
        ({}, "prompt", "required"),
        ({"prompt": ""}, "prompt", "must not be empty"),
        ({"infill": pb.Infill()}, "infill", "both be empty"),
        ({"prompt": "x", "max_tokens": 257}, "max_tokens", "at most 256"),
        ({"prompt": "x", "temperature": -0.1}, "temperature", "between 0 and 2"),
        ({"prompt": "x", "temperature": math.nan}, "temperature", "between 0 and 2"),
        ({"prompt": "x", "top_p": 1.5}, "top_p", "between 0 and 1"),
        ({"prompt": "x", "stop": [""]}, "stop", "1 to 256"),
        ({"prompt": "x", "stop": ["s"] * 17}, "stop", "at most 16"),
        ({"prompt": "x", "request_id": "r" * 129}, "request_id", "at most 128"),
        ({"prompt": "x", "request_id": "a\nb"}, "request_id", "printable"),
        ({"prompt": "x", "top_k": 301}, "top_k", "at most the vocabulary size 300"),
        ({"infill": pb.Infill(prefix="a", path="p" * 1025)}, "infill.path", "at most 1024"),
        ({"infill": pb.Infill(prefix="a", language="l" * 65)}, "infill.language", "at most 64"),
    ],
)
def test_bad_requests_name_field_and_limit(request_kwargs, field, detail) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidRequest) as info:
        spec_from_pb(pb.CompleteRequest(**request_kwargs), LIMITS)
    assert info.value.field == field
    assert detail in str(info.value)


def test_defaults_and_conversion() -> None:
    spec = spec_from_pb(pb.CompleteRequest(prompt="def f(", stop=["\n"], seed=7, top_p=1.0), LIMITS)
    assert spec.prompt.text == "def f("
    assert spec.params.max_tokens == 32
    assert spec.params.greedy and spec.params.top_p == 1.0
    assert spec.params.seed == 7 and spec.params.stop == ("\n",)
    assert len(spec.request_id) == 32  # server-assigned
    fim = spec_from_pb(
        pb.CompleteRequest(infill=pb.Infill(prefix="a", suffix="b"), request_id="r1"), LIMITS
    )
    assert fim.prompt.is_infill and fim.prompt.prefix == "a" and fim.request_id == "r1"
    assert fim.params.seed is None
