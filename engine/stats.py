"""Counters the engine keeps about itself, read by the service's metrics.

The engine thread writes, any thread reads (a scrape); each update is one
attribute store or a dict update under the GIL, so a reader sees a consistent
enough value without a lock on the hot path.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field


@dataclass
class EngineStats:
    requests: int = 0  # requests the engine started (prefilled)
    prompt_tokens: int = 0  # tokens prefilled
    generated_tokens: int = 0  # tokens decoded and handed out
    # Times a CUDA graph could not be captured or replayed and the engine ran
    # that shape eagerly instead, by graph name ("decode", "prefill-512", ...).
    graph_fallbacks: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def record_graph_fallback(self, graph: str) -> None:
        with self._lock:
            self.graph_fallbacks[graph] = self.graph_fallbacks.get(graph, 0) + 1

    def graph_fallback_counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self.graph_fallbacks)
