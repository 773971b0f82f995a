"""GPU telemetry: NVML readings become metrics in base units, throttle reasons are decoded
from the bitmask, the PCIe ceiling comes from the link's generation and width, fields a
GPU does not report stay absent, and without a GPU or NVML nothing is sampled at all."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from nib.service.gpu_metrics import GpuCollector
from nib.service.telemetry import (
    NvmlReader,
    Telemetry,
    open_nvml,
    pcie_link_bytes_per_second,
    throttle_reasons,
)


class NVMLError(Exception):
    pass


def fake_nvml(**overrides: Any) -> SimpleNamespace:
    """An NVML for one H200-like GPU (values in NVML's units: mW, MHz, KB/s)."""

    def value(v: Any) -> Any:
        def fn(handle: object, *args: object) -> Any:
            if isinstance(v, Exception):
                raise v
            return v(*args) if callable(v) else v

        return fn

    values: dict[str, Any] = {
        "nvmlDeviceGetName": "NVIDIA H200",
        "nvmlDeviceGetUUID": "GPU-1234",
        "nvmlDeviceGetTemperature": 41,
        "nvmlDeviceGetPowerUsage": 123_456,
        "nvmlDeviceGetEnforcedPowerLimit": 700_000,
        "nvmlDeviceGetClockInfo": lambda which: {1: 1980, 2: 3201}[which],
        "nvmlDeviceGetMaxClockInfo": lambda which: 1980,
        "nvmlDeviceGetCurrentClocksEventReasons": 0x4 | 0x40,
        "nvmlDeviceGetPcieThroughput": lambda which: {0: 100, 1: 2_000}[which],
        "nvmlDeviceGetCurrPcieLinkGeneration": 1,
        "nvmlDeviceGetCurrPcieLinkWidth": 16,
        "nvmlDeviceGetMaxPcieLinkGeneration": 5,
        "nvmlDeviceGetMaxPcieLinkWidth": 16,
        "nvmlDeviceGetMemoryInfo": SimpleNamespace(used=20 << 30, total=141 << 30),
        "nvmlDeviceGetUtilizationRates": SimpleNamespace(gpu=37, memory=10),
        **overrides,
    }
    return SimpleNamespace(
        NVMLError=NVMLError,
        NVML_TEMPERATURE_GPU=0,
        NVML_CLOCK_SM=1,
        NVML_CLOCK_MEM=2,
        NVML_PCIE_UTIL_TX_BYTES=0,
        NVML_PCIE_UTIL_RX_BYTES=1,
        nvmlDeviceGetCurrentClocksThrottleReasons=value(0),
        **{name: value(v) for name, v in values.items()},
    )


@dataclass
class FakeEngine:
    device: torch.device = field(default_factory=lambda: torch.device("cuda:0"))
    ready: threading.Event = field(default_factory=threading.Event)
    failure: BaseException | None = None
    graph_pool: None = None
    kernel_mode: str = "triton"


def samples(telemetry: Telemetry) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    registry = CollectorRegistry()
    collector = GpuCollector(telemetry.engine, telemetry)  # type: ignore[arg-type]
    collector._memory = lambda: iter(())  # type: ignore[method-assign]  # no CUDA here
    registry.register(collector)
    text = generate_latest(registry).decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def test_pcie_bandwidth_from_generation_and_width() -> None:
    assert pcie_link_bytes_per_second(5, 16) == pytest.approx(63.0e9, rel=1e-3)
    assert pcie_link_bytes_per_second(4, 16) == pytest.approx(31.5e9, rel=1e-3)
    assert pcie_link_bytes_per_second(3, 8) == pytest.approx(7.88e9, rel=1e-3)
    assert pcie_link_bytes_per_second(1, 1) == pytest.approx(250e6)
    assert pcie_link_bytes_per_second(None, 16) is None
    assert pcie_link_bytes_per_second(9, 16) is None  # unknown generation: no guess


def test_throttle_bitmask_is_decoded() -> None:
    assert throttle_reasons(0) == ()
    assert throttle_reasons(0x1 | 0x4 | 0x40) == ("gpu_idle", "sw_power_cap", "hw_thermal_slowdown")
    assert throttle_reasons(None) == ()


def test_nvml_sample_becomes_metrics_in_base_units() -> None:
    telemetry = Telemetry(FakeEngine(), interval_s=5.0)  # type: ignore[arg-type]
    telemetry._reader = NvmlReader(fake_nvml(), handle=object())  # type: ignore[arg-type]
    telemetry.tick()
    got = samples(telemetry)
    dev = ("device", "cuda:0")

    def v(name: str, *labels: tuple[str, str]) -> float:
        return got[(name, frozenset((dev, *labels)))]

    assert v("nib_gpu_info", ("gpu", "NVIDIA H200")) == 1
    assert v("nib_gpu_temperature_celsius") == 41
    assert v("nib_gpu_power_watts") == pytest.approx(123.456)
    assert v("nib_gpu_power_limit_watts") == 700
    assert v("nib_gpu_sm_clock_hertz") == 1980e6
    assert v("nib_gpu_memory_clock_hertz") == 3201e6
    assert v("nib_gpu_utilization_ratio") == pytest.approx(0.37)
    assert v("nib_gpu_pcie_rx_bytes_per_second") == 2000 * 1024
    assert v("nib_gpu_pcie_tx_bytes_per_second") == 100 * 1024
    assert v("nib_gpu_pcie_link_bytes_per_second") == pytest.approx(63.0e9, rel=1e-3)
    assert v("nib_gpu_pcie_link_generation", ("which", "current")) == 1
    assert v("nib_gpu_pcie_link_generation", ("which", "max")) == 5
    assert v("nib_gpu_memory_used_bytes") == 20 << 30
    assert v("nib_gpu_throttle_active", ("reason", "sw_power_cap")) == 1
    assert v("nib_gpu_throttle_active", ("reason", "hw_thermal_slowdown")) == 1
    assert v("nib_gpu_throttle_active", ("reason", "gpu_idle")) == 0
    assert v("nib_gpu_telemetry_errors_total") == 0
    # Throttled time accumulates from the second sample on, per reason.
    first = telemetry.latest
    assert first is not None
    telemetry.tick()
    second = telemetry.latest
    assert second is not None and second.monotonic > first.monotonic
    got = samples(telemetry)
    waited = second.monotonic - first.monotonic
    assert v("nib_gpu_throttle_seconds_total", ("reason", "sw_power_cap")) == pytest.approx(waited)
    assert v("nib_gpu_throttle_seconds_total", ("reason", "gpu_idle")) == 0


def test_fields_a_gpu_does_not_report_stay_absent() -> None:
    nvml = fake_nvml(
        nvmlDeviceGetPowerUsage=NVMLError("Not Supported"),
        nvmlDeviceGetPcieThroughput=NVMLError("Not Supported"),
        nvmlDeviceGetCurrentClocksEventReasons=NVMLError("Function Not Found"),
    )
    telemetry = Telemetry(FakeEngine(), interval_s=5.0)  # type: ignore[arg-type]
    telemetry._reader = NvmlReader(nvml, handle=object())  # type: ignore[arg-type]
    telemetry.tick()
    names = {name for name, _ in samples(telemetry)}
    assert "nib_gpu_temperature_celsius" in names
    assert "nib_gpu_power_watts" not in names  # absent, not 0
    assert "nib_gpu_pcie_rx_bytes_per_second" not in names
    # The older throttle-reason call answers when the renamed one is missing.
    assert telemetry.latest is not None and telemetry.latest.throttle_mask == 0


def test_no_nvml_means_no_samples_and_a_reason() -> None:
    broken = SimpleNamespace(nvmlInit=lambda: (_ for _ in ()).throw(RuntimeError("no driver")))
    reader, why = open_nvml(0, broken)  # type: ignore[arg-type]
    assert reader is None and why == "NVML did not start: no driver"
    telemetry = Telemetry(FakeEngine(), interval_s=5.0)  # type: ignore[arg-type]
    telemetry.tick()
    assert telemetry.latest is None
    sampled = {n for n, _ in samples(telemetry) if n.startswith("nib_gpu_")}
    assert sampled == {"nib_gpu_telemetry_errors_total"}  # the thread runs; NVML does not


def test_cpu_engine_has_no_thread_and_says_why() -> None:
    engine = FakeEngine(device=torch.device("cpu"), kernel_mode="cpu")
    cpu = Telemetry(engine, interval_s=5.0)  # type: ignore[arg-type]
    assert not cpu.enabled and cpu.note == "no GPU: the engine runs on the CPU"
    cpu.start()
    assert cpu._thread is None
    assert samples(cpu) == {}
    off = Telemetry(FakeEngine(), interval_s=0)  # type: ignore[arg-type]
    assert not off.enabled and "--telemetry-interval 0" in off.note


def test_fragmentation_warns_once_per_crossing(monkeypatch: pytest.MonkeyPatch) -> None:
    from nib.engine.memory import MemoryHealth
    from nib.service import telemetry as module

    values = iter([0.1, 0.5, 0.6, 0.2, 0.7])
    monkeypatch.setattr(
        module, "memory_health", lambda device, pool: MemoryHealth(1, 2, None, next(values))
    )
    engine = FakeEngine()
    engine.ready.set()
    t = Telemetry(engine, interval_s=5.0, fragmentation_threshold=0.3)  # type: ignore[arg-type]
    seen = []
    for _ in range(5):
        t.tick()
        seen.append(t.fragmentation_warnings)
    assert seen == [0, 1, 1, 1, 2]
