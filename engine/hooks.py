"""Hooks the engine calls at its lifecycle points, so that a host (the gRPC
service, a test) can react without the engine knowing about it.

Every hook runs on the engine thread: keep it short, and hand work to another
thread or event loop (e.g. `loop.call_soon_threadsafe`). An exception escaping
`before_step` or `before_ready` is fatal to the engine thread, exactly like a
real failure there; that is what fault-injection tests use it for.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


class EngineState(enum.Enum):
    READY = "ready"  # loaded, warmed up (on a GPU: graphs captured); serving
    FAILED = "failed"  # failed to start, or the engine thread died; will not serve again
    STOPPED = "stopped"  # stopped on request


@dataclass(frozen=True)
class EngineHooks:
    # Called once per state change.
    on_state: Callable[[EngineState], None] | None = None
    # Called after warm-up, before the engine reports ready.
    before_ready: Callable[[], None] | None = None
    # Called between two decode steps: (request_id, tokens generated so far).
    before_step: Callable[[str, int], None] | None = None
    # Tests only: the start-up kernel self-check calls it with (kernel, inputs) before
    # running the kernel under test and runs the kernel on what it returns, while the
    # reference keeps the original inputs: a corrupted input must fail the check.
    tamper_selfcheck: Callable[[str, dict[str, Any]], dict[str, Any]] | None = None
