"""Fault injection for tests: `NIB_FAULT_INJECTION="key=value,..."` in the server's
environment turns on engine hooks that simulate failures. Never set it in
production; the server logs a warning when it is set.

Keys:
  warmup_delay_s=S             warm-up takes S seconds longer (health stays NOT_SERVING)
  step_delay_s=S               every decode step takes S seconds longer (a slow engine)
  engine_crash_after_tokens=N  the engine thread dies after its N-th generated token
  request_error_after_tokens=N a request fails (an exception in the engine) after N tokens;
                               the engine goes on serving
  corrupt_kernel=NAME          the start-up self-check feeds kernel NAME (e.g. int4_linear,
                               linear, rms_norm) a corrupted input: its scales (INT4) or weight
                               in a wrong layout, else its first input reversed. The check must
                               fail and the engine refuse to serve (GPU engines only)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import torch

from nib.engine.hooks import EngineHooks, EngineState

ENV_VAR = "NIB_FAULT_INJECTION"


class InjectedCrash(BaseException):
    """Kills the engine thread the way a fatal error would (not an Exception, so the
    engine's per-request error handling does not catch it)."""


class InjectedRequestError(RuntimeError):
    """Fails the one request being generated, as a bug in a kernel might."""


@dataclass(frozen=True)
class FaultPlan:
    warmup_delay_s: float = 0.0
    step_delay_s: float = 0.0
    engine_crash_after_tokens: int = 0  # 0: off
    request_error_after_tokens: int = 0  # 0: off
    corrupt_kernel: str = ""  # "": off

    @classmethod
    def parse(cls, text: str) -> FaultPlan:
        known = {f.name: f.type for f in fields(cls)}
        values: dict[str, float | int | str] = {}
        for item in filter(None, (part.strip() for part in text.split(","))):
            key, sep, value = item.partition("=")
            if not sep or key not in known:
                raise ValueError(f"{ENV_VAR}: unknown item {item!r}; known keys: {sorted(known)}")
            kind = known[key]
            values[key] = int(value) if kind == "int" else value if kind == "str" else float(value)
        return cls(**values)  # type: ignore[arg-type]

    def hooks(self, on_state: Callable[[EngineState], None] | None) -> EngineHooks:
        def before_ready() -> None:
            time.sleep(self.warmup_delay_s)

        def before_step(request_id: str, generated: int) -> None:
            if self.step_delay_s:
                time.sleep(self.step_delay_s)
            if 0 < self.engine_crash_after_tokens <= generated:
                raise InjectedCrash(f"injected crash after {generated} tokens of {request_id}")
            if 0 < self.request_error_after_tokens <= generated:
                raise InjectedRequestError(f"injected error after {generated} tokens")

        return EngineHooks(
            on_state=on_state,
            before_ready=before_ready,
            before_step=before_step,
            tamper_selfcheck=self._corrupt if self.corrupt_kernel else None,
        )

    def _corrupt(self, kernel: str, inputs: dict[str, Any]) -> dict[str, Any]:
        if kernel != self.corrupt_kernel:
            return inputs
        name = next(
            (n for n in ("scales", "weight") if n in inputs),
            next(n for n, v in inputs.items() if isinstance(v, torch.Tensor)),
        )
        return {**inputs, name: wrong_layout(inputs[name])}


def wrong_layout(t: torch.Tensor) -> torch.Tensor:
    """The same values read in the wrong order: a 2-D tensor's transpose reinterpreted in
    its own shape (a [K/128, N] scale table read as [N, K/128]), else reversed."""
    if t.dim() == 2 and min(t.shape) > 1:
        return t.t().contiguous().view(t.shape)
    return t.flip(-1).contiguous()
