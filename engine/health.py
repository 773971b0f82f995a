"""A snapshot of the engine's health for a person: its state, the graphs, the start-up
self-check, the kernel each layer runs, versions and memory. Read from any thread
(the service's health-detail RPC); every field is copied, nothing is shared."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from nib.engine.kernel_paths import KernelPath
from nib.engine.memory import MemoryHealth, memory_health
from nib.engine.selfcheck import SelfCheckReport
from nib.engine.startup import kernel_fallbacks
from nib.engine.versions import Versions

if TYPE_CHECKING:
    from nib.engine.engine import Engine


@dataclass(frozen=True)
class GraphDetail:
    name: str
    ready: bool
    fallback: bool
    capture_ms: float
    error: str
    eager_runs: int  # times this shape ran eagerly for want of its graph


@dataclass(frozen=True)
class EngineHealth:
    state: str  # starting | ready | failed | stopped
    error: str  # why it failed
    kernel_mode: str  # cpu | pending | triton | reference
    self_check: SelfCheckReport
    graphs: tuple[GraphDetail, ...]
    kernel_paths: tuple[KernelPath, ...]
    kernel_fallbacks: dict[str, int]
    versions: Versions
    memory: MemoryHealth | None  # None on the CPU


def engine_health(engine: Engine) -> EngineHealth:
    if engine.failure is not None:
        state, error = "failed", f"{type(engine.failure).__name__}: {engine.failure}"
    elif engine.ready.is_set():
        state, error = ("ready" if engine.alive else "stopped"), ""
    else:
        state, error = "starting", ""
    runner = engine.runner
    counts = engine.stats.graph_fallback_counts()
    graphs = tuple(
        GraphDetail(s.name, s.ready, s.fallback, s.capture_ms, s.error, counts.get(s.name, 0))
        for s in (list(runner.states.values()) if runner else [])
    )
    memory = None
    if engine.device.type == "cuda":
        memory = memory_health(engine.device, engine.graph_pool)
    return EngineHealth(
        state=state,
        error=error,
        kernel_mode=engine.kernel_mode,
        self_check=engine.selfcheck,
        graphs=graphs,
        kernel_paths=engine.kernel_paths,
        kernel_fallbacks=kernel_fallbacks(engine.kernel_mode),
        versions=engine.versions,
        memory=memory,
    )
