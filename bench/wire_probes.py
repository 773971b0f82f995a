"""`nib serve` with timestamps along a completion's path, for bench/wire_trace.py.

    python3 bench/wire_probes.py OUT.json [nib serve arguments...]

Wraps (at run time, nothing in the service changes) the functions a Complete call, or a
completion on an open Session, passes through and records (label, time.perf_counter_ns()) for each; at exit the list
goes to OUT.json. Only a request's first pass through a probe counts (see
wire_trace.split). NIB_TRACE_STUB="PREFILL_MS,STEP_MS" replaces the model's forward by a
wait of that long with the GIL released and logits that always pick one ordinary token
(the middle id of the vocabulary): what the host does around a GPU engine, without a
GPU (the CPU engine's kernels would hold both cores otherwise). NIB_TRACE_SWITCH_US sets
the server's GIL switch interval (sys.setswitchinterval, µs); the interval it runs with
is the first stamp, `switch_interval_us`, whose value is that interval, not a time.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

STAMPS: list[tuple[str, int]] = []


def stamp(label: str) -> None:
    STAMPS.append((label, time.perf_counter_ns()))


def stub_model(prefill_ms: float, step_ms: float) -> None:
    import torch

    from nib.engine import model

    def forward(
        self: Any, tokens: torch.Tensor, input_pos: torch.Tensor, *args: Any, **kw: Any
    ) -> torch.Tensor:
        last_only = kw.get("last_only", False)
        time.sleep((prefill_ms if last_only else step_ms) / 1e3)
        logits = torch.zeros(1, 1 if last_only else tokens.shape[1], self.cfg.vocab_size)
        # One ordinary token wins (flat logits would pick id 0, end-of-text in the shipped
        # tokenizer, and every completion would end at its first token).
        logits[..., self.cfg.vocab_size // 2] = 1.0
        return logits

    model.Transformer.forward = forward  # type: ignore[method-assign]


def before(owner: Any, name: str, label: str) -> None:
    """Stamp `label` when owner.name is called."""
    inner = getattr(owner, name)

    def wrapper(*args: Any, **kw: Any) -> Any:
        stamp(label)
        return inner(*args, **kw)

    setattr(owner, name, wrapper)


def after(owner: Any, name: str, label: str) -> None:
    """Stamp `label` when owner.name returns."""
    inner = getattr(owner, name)

    def wrapper(*args: Any, **kw: Any) -> Any:
        result = inner(*args, **kw)
        stamp(label)
        return result

    setattr(owner, name, wrapper)


def first_item(owner: Any, name: str, label: str, keep: Callable[[Any], bool]) -> None:
    """Stamp `label` when the async generator owner.name yields its first item that
    `keep` accepts."""
    inner = getattr(owner, name)

    async def wrapper(*args: Any, **kw: Any) -> AsyncIterator[Any]:
        pending = True
        async for item in inner(*args, **kw):
            if pending and keep(item):
                stamp(label)
                pending = False
            yield item

    setattr(owner, name, wrapper)


def first_per_request(owner: Any, name: str, label: str) -> None:
    """Stamp `label` when the async generator owner.name yields the first delta of each
    request (a Session's stream carries one completion after another)."""
    inner = getattr(owner, name)

    async def wrapper(*args: Any, **kw: Any) -> AsyncIterator[Any]:
        seen: set[str] = set()
        async for item in inner(*args, **kw):
            if item.HasField("delta") and item.request_id not in seen:
                seen.add(item.request_id)
                stamp(label)
            yield item

    setattr(owner, name, wrapper)


def install() -> None:
    from nib.engine import engine
    from nib.service import interceptors, ledger, servicer, session

    outer: list[object] = []
    intercept = interceptors.GuardInterceptor.intercept_service

    async def intercept_service(self: Any, continuation: Any, details: Any) -> Any:
        outer[:] = outer or [self]  # the first interceptor gRPC runs
        if self is outer[0] and details.method.endswith("/Complete"):
            stamp("intercept")
        return await intercept(self, continuation, details)

    interceptors.GuardInterceptor.intercept_service = intercept_service  # type: ignore[method-assign]
    # On a Session the call is open already: a completion starts when its start message
    # is read off the stream (stamped as "intercept", where bench/wire_trace.split cuts).
    before(session.SessionStream, "_start", "intercept")
    before(ledger.Ledger, "open", "handler")
    after(ledger.convert, "spec_from_pb", "parsed")
    after(engine.Engine, "encode_prompt", "tokenised")
    before(engine.Engine, "submit", "submit")
    after(engine.Engine, "submit", "queued")
    before(engine.Engine, "_serve", "picked")
    # What the engine thread does between taking the job and calling the model.
    from nib.engine import graphs, healing, prefix_cache

    after(healing.TokenHealer, "plan", "healed")
    after(prefix_cache.PrefixCache, "acquire", "prefix_found")
    before(graphs.GraphRunner, "set_first_bias", "output_ready")
    before(engine.Engine, "_decode_cpu", "prefill")
    before(engine.Engine, "_decode_gpu", "prefill")
    token = engine._Output.token

    def first_token(self: Any, *args: Any, **kw: Any) -> bool:
        first = not self.stamps
        going_on: bool = token(self, *args, **kw)
        if first and self.stamps:  # the engine's own stamp: its time to first token ends here
            STAMPS.append(("first_token", round(self.stamps[0] * 1e9)))
            stamp("sink")
        return going_on

    engine._Output.token = first_token  # type: ignore[method-assign]
    first_item(ledger.Tracked, "events", "loop_event", lambda event: True)
    first_item(
        servicer.CompletionServicer,
        "Complete",
        "yielded",
        lambda message: message.HasField("delta"),
    )
    first_per_request(servicer.CompletionServicer, "Session", "yielded")


def set_switch_interval() -> None:
    """The GIL switch interval from NIB_TRACE_SWITCH_US (µs; Python's own if unset),
    recorded as a stamp."""
    if os.environ.get("NIB_TRACE_SWITCH_US"):
        sys.setswitchinterval(float(os.environ["NIB_TRACE_SWITCH_US"]) / 1e6)
    STAMPS.append(("switch_interval_us", round(sys.getswitchinterval() * 1e6)))


def main() -> int:
    out = Path(sys.argv[1])
    atexit.register(lambda: out.write_text(json.dumps(STAMPS)))
    set_switch_interval()
    if os.environ.get("NIB_TRACE_STUB"):
        prefill_ms, step_ms = map(float, os.environ["NIB_TRACE_STUB"].split(","))
        stub_model(prefill_ms, step_ms)
    install()
    from nib.service.cli import main as serve

    return serve(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
