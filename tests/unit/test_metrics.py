"""The metrics registry: families present, CUDA memory absent (not zero) on a CPU engine."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from nib.engine.engine import Engine, EngineConfig
from nib.service.metrics import Metrics


def families(metrics: Metrics) -> dict[str, list[tuple[dict[str, str], float]]]:
    text = generate_latest(metrics.registry).decode()
    return {
        f.name: [(s.labels, s.value) for s in f.samples]
        for f in text_string_to_metric_families(text)
    }


def test_cpu_engine_metrics(random_model_dir: Path) -> None:
    engine = Engine(EngineConfig(model_dir=random_model_dir, max_context=64))
    metrics = Metrics(engine)
    engine.stats.record_graph_fallback("decode")
    metrics.requests.labels("Complete", "acme", "OK").inc()
    metrics.ttft.observe(0.012)
    got = families(metrics)
    for name in (
        "nib_cuda_memory_allocated_bytes",
        "nib_cuda_memory_reserved_bytes",
        "nib_cuda_memory_allocated_ratio",
    ):
        assert got[name] == [], name  # declared, no samples on a CPU engine
    assert got["nib_queue_depth"] == [({}, 0.0)]
    assert got["nib_engine_ready"] == [({}, 0.0)]  # not started
    assert ({"graph": "decode"}, 1.0) in got["nib_graph_fallbacks"]
    assert ({"method": "Complete", "tenant": "acme", "code": "OK"}, 1.0) in got["nib_requests"]
    ttft = dict((s[0].get("le"), s[1]) for s in got["nib_time_to_first_token_seconds"])
    assert ttft["0.01"] == 0.0 and ttft["0.02"] == 1.0
    assert got["nib_process_threads"][0][1] >= 1
    assert "process_resident_memory_bytes" in got
