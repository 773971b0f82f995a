"""Prometheus metrics of the GPU's state (NVML telemetry), CUDA memory health and kernel
fallbacks, read at scrape time.

Every family is always declared; samples exist only where there is something to
report (a GPU, NVML, a captured graph pool, kernels that run), so a dashboard
shows "no data" on a CPU server rather than a reassuring zero. Labels are
bounded: `device` (one), `reason` (NVML's fixed throttle reasons), `which`
(current, max), `kernel` (engine/startup.py GPU_KERNELS).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from nib.engine.engine import Engine
from nib.engine.memory import memory_health
from nib.engine.startup import kernel_fallbacks
from nib.service.telemetry import THROTTLE_REASONS, GpuSample, Telemetry

MHZ = 1e6


class GpuCollector(Collector):
    def __init__(self, engine: Engine, telemetry: Telemetry) -> None:
        self.engine, self.telemetry = engine, telemetry

    def collect(self) -> Iterator[Metric]:
        yield from self._telemetry(self.telemetry.latest)
        yield from self._memory()
        fallbacks = CounterMetricFamily(
            "nib_kernel_fallbacks",
            "Times a kernel fell back to a slower path (an INT4 kernel that failed here and "
            "was replaced; every kernel, once, on the reference path). Absent on the CPU.",
            labels=["kernel"],
        )
        for kernel, count in sorted(kernel_fallbacks(self.engine.kernel_mode).items()):
            fallbacks.add_metric([kernel], count)
        yield fallbacks

    def _telemetry(self, s: GpuSample | None) -> Iterator[Metric]:
        device = str(self.engine.device)

        def gauge(name: str, doc: str, value: float | None) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc + " (NVML; absent without a GPU)", labels=["device"])
            if value is not None:
                g.add_metric([device], value)
            return g

        def get(attr: str, factor: float = 1.0) -> float | None:
            v = None if s is None else getattr(s, attr)
            return None if v is None else float(v) * factor

        info = GaugeMetricFamily(
            "nib_gpu_info", "The GPU the engine runs on (value 1).", labels=["device", "gpu"]
        )
        if s is not None:
            info.add_metric([device, s.name], 1)
        yield info
        yield gauge("nib_gpu_temperature_celsius", "GPU temperature.", get("temperature_c"))
        yield gauge("nib_gpu_power_watts", "Power draw.", get("power_w"))
        yield gauge("nib_gpu_power_limit_watts", "Enforced power limit.", get("power_limit_w"))
        yield gauge("nib_gpu_sm_clock_hertz", "SM clock.", get("sm_clock_mhz", MHZ))
        yield gauge("nib_gpu_sm_clock_max_hertz", "Highest SM clock.", get("sm_clock_max_mhz", MHZ))
        yield gauge("nib_gpu_memory_clock_hertz", "Memory clock.", get("memory_clock_mhz", MHZ))
        yield gauge(
            "nib_gpu_utilization_ratio", "Share of time the GPU was busy.", get("utilization")
        )
        yield gauge("nib_gpu_memory_used_bytes", "Device memory in use.", get("memory_used_bytes"))
        yield gauge("nib_gpu_memory_total_bytes", "Device memory.", get("memory_total_bytes"))
        yield gauge(
            "nib_gpu_pcie_rx_bytes_per_second",
            "PCIe receive (host to GPU) throughput.",
            get("pcie_rx_bytes_per_s"),
        )
        yield gauge(
            "nib_gpu_pcie_tx_bytes_per_second",
            "PCIe transmit (GPU to host) throughput.",
            get("pcie_tx_bytes_per_s"),
        )
        yield gauge(
            "nib_gpu_pcie_link_bytes_per_second",
            "PCIe bandwidth per direction at the link's maximum generation and width.",
            None if s is None else s.pcie_link_bytes_per_s,
        )
        for metric, doc, cur, top in (
            ("generation", "PCIe link generation", "pcie_generation", "pcie_max_generation"),
            ("width", "PCIe link width in lanes", "pcie_width", "pcie_max_width"),
        ):
            g = GaugeMetricFamily(
                f"nib_gpu_pcie_link_{metric}",
                f"{doc}: current (trains down when idle) and max (NVML; absent without a GPU).",
                labels=["device", "which"],
            )
            for which, attr in (("current", cur), ("max", top)):
                value = get(attr)
                if value is not None:
                    g.add_metric([device, which], value)
            yield g
        active = GaugeMetricFamily(
            "nib_gpu_throttle_active",
            "1 while NVML reports this clock throttle reason (gpu_idle is harmless; NVML; "
            "absent without a GPU).",
            labels=["device", "reason"],
        )
        seconds = CounterMetricFamily(
            "nib_gpu_throttle_seconds",
            "Seconds (in whole sample periods) each throttle reason was active.",
            labels=["device", "reason"],
        )
        if s is not None and s.throttle_mask is not None:
            on = set(s.throttle_reasons)
            totals = dict(self.telemetry.throttle_seconds)
            for reason in THROTTLE_REASONS.values():
                active.add_metric([device, reason], float(reason in on))
                seconds.add_metric([device, reason], totals.get(reason, 0.0))
        yield active
        yield seconds
        stamp = GaugeMetricFamily(
            "nib_gpu_telemetry_last_sample_timestamp_seconds",
            "Unix time of the latest NVML sample (absent without a GPU).",
            labels=["device"],
        )
        errors = CounterMetricFamily(
            "nib_gpu_telemetry_errors", "Telemetry rounds that failed.", labels=["device"]
        )
        if self.telemetry.enabled:
            errors.add_metric([device], self.telemetry.errors)
            if s is not None:
                stamp.add_metric([device], s.unix)
        yield stamp
        yield errors

    def _memory(self) -> Iterator[Metric]:
        engine, device = self.engine, str(self.engine.device)
        pool = GaugeMetricFamily(
            "nib_cuda_graph_pool_bytes",
            "Bytes reserved by the CUDA graphs' private memory pool (absent without graphs).",
            labels=["device"],
        )
        frag = GaugeMetricFamily(
            "nib_cuda_memory_fragmentation_ratio",
            "1 - allocated / reserved CUDA memory outside the graph pool (absent on the CPU).",
            labels=["device"],
        )
        warnings = CounterMetricFamily(
            "nib_cuda_memory_fragmentation_warnings",
            "Times fragmentation rose above --fragmentation-threshold (absent on the CPU).",
            labels=["device"],
        )
        if engine.device.type == "cuda":
            if engine.graph_pool is not None:
                pool.add_metric([device], engine.graph_pool.reserved)
            health = memory_health(engine.device, engine.graph_pool)
            if health.fragmentation is not None:
                frag.add_metric([device], health.fragmentation)
            warnings.add_metric([device], self.telemetry.fragmentation_warnings)
        yield from (pool, frag, warnings)
