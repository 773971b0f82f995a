"""Prometheus metrics, served over HTTP by `nib serve --metrics-port N`.

Labels are bounded: `method` (Complete, Session), `tenant` (the names in the
API key file, or "anonymous"), `code` (gRPC status names), `cause` and
`finish_reason` (small enums), `graph` (the engine's fixed graph ladder),
`device` (one). Never a request id.

CUDA memory gauges are always declared; on a CPU engine they have no samples
(absent, not 0), so a dashboard shows "no data" rather than a reassuring zero.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from nib.engine.engine import Engine
from nib.service.gpu_metrics import GpuCollector
from nib.service.telemetry import Telemetry

TTFT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
ITL_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0)
WAIT_BUCKETS = (0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class EngineCollector(Collector):
    """Read at scrape time from the engine: queue depth, readiness, its counters, CUDA memory."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def collect(self) -> Iterator[Metric]:
        engine = self.engine
        yield GaugeMetricFamily(
            "nib_queue_depth", "Requests waiting for the engine.", value=engine.queue_depth
        )
        ready = engine.ready.is_set() and engine.alive and engine.failure is None
        yield GaugeMetricFamily(
            "nib_engine_ready", "1 when the engine is warm and its thread alive.", value=ready
        )
        tokens = CounterMetricFamily(
            "nib_engine_tokens", "Tokens the engine processed.", labels=["phase"]
        )
        tokens.add_metric(["prefill"], engine.stats.prompt_tokens)
        tokens.add_metric(["decode"], engine.stats.generated_tokens)
        yield tokens
        prompt = CounterMetricFamily(
            "nib_prompt_bytes",
            "Prompt bytes tokenised, and bytes that a session's earlier prompt spared "
            "tokenising again.",
            labels=["kind"],
        )
        prompt.add_metric(["tokenised"], engine.session_tokens.tokenised_bytes)
        prompt.add_metric(["reused"], engine.session_tokens.reused_bytes)
        yield prompt
        fallbacks = CounterMetricFamily(
            "nib_graph_fallbacks",
            "Times a CUDA graph failed to capture or replay and the shape ran eagerly.",
            labels=["graph"],
        )
        counts = engine.stats.graph_fallback_counts()
        for name in {g[0] for g in engine.info().graphs} | set(counts):
            fallbacks.add_metric([name], counts.get(name, 0))
        yield fallbacks
        yield from self._cuda_memory()
        threads = GaugeMetricFamily("nib_process_threads", "OS threads of the server process.")
        if os.path.isdir("/proc/self/task"):
            threads.add_metric([], len(os.listdir("/proc/self/task")))
        yield threads

    def _cuda_memory(self) -> Iterator[Metric]:
        allocated = GaugeMetricFamily(
            "nib_cuda_memory_allocated_bytes",
            "Bytes of CUDA memory held by tensors (absent on a CPU engine).",
            labels=["device"],
        )
        reserved = GaugeMetricFamily(
            "nib_cuda_memory_reserved_bytes",
            "Bytes of CUDA memory reserved by the caching allocator (absent on a CPU engine).",
            labels=["device"],
        )
        ratio = GaugeMetricFamily(
            "nib_cuda_memory_allocated_ratio",
            "allocated / reserved CUDA memory (absent on a CPU engine or when nothing is reserved).",
            labels=["device"],
        )
        device = self.engine.device
        if device.type == "cuda":
            import torch

            a = torch.cuda.memory_allocated(device)
            r = torch.cuda.memory_reserved(device)
            allocated.add_metric([str(device)], a)
            reserved.add_metric([str(device)], r)
            if r:
                ratio.add_metric([str(device)], a / r)
        yield from (allocated, reserved, ratio)


class Metrics:
    """Every metric the service records; one registry per server (tests run several)."""

    def __init__(
        self,
        engine: Engine,
        registry: CollectorRegistry | None = None,
        telemetry: Telemetry | None = None,
    ) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "nib_requests",
            "Completions (Complete calls and Session starts) by the gRPC status they ended "
            "with; OK includes ones cancelled or superseded by a session message.",
            ["method", "tenant", "code"],
            registry=r,
        )
        self.finished = Counter(
            "nib_completions_finished",
            "Completions the engine ended, by finish reason.",
            ["tenant", "finish_reason"],
            registry=r,
        )
        self.cancellations = Counter(
            "nib_cancellations",
            "Completions cancelled before their end, by cause: request (a Cancel message), "
            "client_gone (the call was cancelled or the connection lost), deadline, shutdown.",
            ["tenant", "cause"],
            registry=r,
        )
        self.supersessions = Counter(
            "nib_supersessions",
            "Completions replaced by a newer start on the same session.",
            ["tenant"],
            registry=r,
        )
        self.auth_failures = Counter(
            "nib_auth_failures",
            "Calls rejected for a missing or invalid API key.",
            ["reason"],
            registry=r,
        )
        self.generated_tokens = Counter(
            "nib_generated_tokens", "Tokens generated, by tenant.", ["tenant"], registry=r
        )
        self.ttft = Histogram(
            "nib_time_to_first_token_seconds",
            "From a completion's arrival to its first token being ready to send.",
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.inter_token = Histogram(
            "nib_inter_token_latency_seconds",
            "Time between consecutive generated tokens.",
            buckets=ITL_BUCKETS,
            registry=r,
        )
        self.queue_wait = Histogram(
            "nib_queue_wait_seconds",
            "Time a completion waited behind others before its prefill.",
            buckets=WAIT_BUCKETS,
            registry=r,
        )
        self.inflight = Gauge(
            "nib_inflight_requests", "Completions admitted and not yet ended.", registry=r
        )
        self.sessions = Gauge("nib_open_sessions", "Open Session streams.", registry=r)
        r.register(EngineCollector(engine))
        # Without a telemetry thread (tests): the GPU families are declared, never sampled.
        r.register(GpuCollector(engine, telemetry or Telemetry(engine, interval_s=0)))
        ProcessCollector(registry=r)


class MetricsServer:
    """The HTTP endpoint (GET /metrics), on its own thread."""

    def __init__(self, metrics: Metrics, host: str, port: int) -> None:
        self._httpd, self._thread = start_http_server(port, host, registry=metrics.registry)

    @property
    def port(self) -> int:
        port: int = self._httpd.server_port
        return port

    def close(self) -> None:
        httpd: WSGIServer = self._httpd
        httpd.shutdown()
        httpd.server_close()
        thread: threading.Thread = self._thread
        thread.join(5)
