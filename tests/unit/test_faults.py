"""The fault-injection plan parses strictly and its hooks do what they say."""

from __future__ import annotations

import time

import pytest

from nib.service.faults import FaultPlan, InjectedCrash, InjectedRequestError


def test_parse() -> None:
    plan = FaultPlan.parse("warmup_delay_s=0.5, engine_crash_after_tokens=3,step_delay_s=0.01")
    assert plan == FaultPlan(warmup_delay_s=0.5, step_delay_s=0.01, engine_crash_after_tokens=3)
    assert FaultPlan.parse("") == FaultPlan()
    assert FaultPlan.parse("corrupt_kernel=int4_linear") == FaultPlan(corrupt_kernel="int4_linear")
    assert FaultPlan().hooks(None).tamper_selfcheck is None
    with pytest.raises(ValueError, match="unknown item 'explode=1'"):
        FaultPlan.parse("explode=1")
    with pytest.raises(ValueError, match="unknown item 'step_delay_s'"):
        FaultPlan.parse("step_delay_s")


def test_hooks() -> None:
    hooks = FaultPlan(engine_crash_after_tokens=3, step_delay_s=0.02).hooks(None)
    assert hooks.before_step is not None
    started = time.perf_counter()
    hooks.before_step("r", 2)
    assert time.perf_counter() - started >= 0.02
    with pytest.raises(InjectedCrash):
        hooks.before_step("r", 3)
    assert not issubclass(InjectedCrash, Exception)  # the engine's per-request handler lets it by
    err = FaultPlan(request_error_after_tokens=1).hooks(None)
    assert err.before_step is not None
    with pytest.raises(InjectedRequestError):
        err.before_step("r", 1)
