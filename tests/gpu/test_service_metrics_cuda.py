"""On a CUDA engine the memory gauges have samples: allocated <= reserved, ratio in (0, 1]."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from nib.engine.engine import Engine, EngineConfig
from nib.service.metrics import Metrics


def test_cuda_memory_gauges(random_model_dir: Path) -> None:
    engine = Engine(EngineConfig(model_dir=random_model_dir, device="cuda", max_context=256))
    engine.start()
    try:
        assert engine.wait_ready(120), engine.failure
        text = generate_latest(Metrics(engine).registry).decode()
    finally:
        engine.stop()
    got = {
        f.name: {s.labels["device"]: s.value for s in f.samples}
        for f in text_string_to_metric_families(text)
        if f.name.startswith("nib_cuda_memory")
    }
    device = str(engine.device)
    allocated = got["nib_cuda_memory_allocated_bytes"][device]
    reserved = got["nib_cuda_memory_reserved_bytes"][device]
    assert 0 < allocated <= reserved
    assert got["nib_cuda_memory_allocated_ratio"][device] == pytest.approx(allocated / reserved)
