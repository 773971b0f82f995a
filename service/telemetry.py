"""GPU telemetry from NVML, and the memory-fragmentation watch, on a background thread.

Every `interval_s` the thread reads the engine's GPU through NVML (the
`nvidia-ml-py` package, imported as `pynvml`): temperature, power draw and
limit, SM and memory clocks, the clock throttle reasons, PCIe receive/transmit
throughput and link, memory used, utilisation. Each field is read on its own, so
a GPU that does not report one (MIG, vGPU) still reports the rest. Without a
GPU, without the package or without a working NVML there is no sample at all and
the metrics are absent, never zero; `note` says why.

The same thread watches the CUDA caching allocator's fragmentation
(engine/memory.py) and logs a warning, once per crossing, when it passes the
configured threshold.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import structlog

from nib.engine.engine import Engine
from nib.engine.memory import memory_health

log = structlog.get_logger("nib.service")

# NVML's clock event ("throttle") reason bits (nvmlClocksEventReason*).
THROTTLE_REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
# Per lane and direction: transfer rate (GT/s) x line-code efficiency / 8 bits.
_PCIE_LANE = {
    1: 2.5e9 * 8 / 10 / 8,
    2: 5e9 * 8 / 10 / 8,
    3: 8e9 * 128 / 130 / 8,
    4: 16e9 * 128 / 130 / 8,
    5: 32e9 * 128 / 130 / 8,
    6: 64e9 * 242 / 256 / 8,  # PAM4 with 256-byte FLITs, 242 of them payload
}


def pcie_link_bytes_per_second(generation: int | None, width: int | None) -> float | None:
    """Bandwidth of a PCIe link per direction, e.g. gen5 x16 -> 63.0e9 bytes/s."""
    if not generation or not width or generation not in _PCIE_LANE:
        return None
    return _PCIE_LANE[generation] * width


def throttle_reasons(mask: int | None) -> tuple[str, ...]:
    if mask is None:
        return ()
    return tuple(name for bit, name in THROTTLE_REASONS.items() if mask & bit)


@dataclass(frozen=True)
class GpuSample:
    """One NVML reading; None where the GPU did not report the field."""

    monotonic: float
    unix: float
    name: str = ""
    uuid: str = ""
    temperature_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    sm_clock_mhz: float | None = None
    sm_clock_max_mhz: float | None = None
    memory_clock_mhz: float | None = None
    throttle_mask: int | None = None
    pcie_rx_bytes_per_s: float | None = None
    pcie_tx_bytes_per_s: float | None = None
    pcie_generation: int | None = None
    pcie_width: int | None = None
    pcie_max_generation: int | None = None
    pcie_max_width: int | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    utilization: float | None = None

    @property
    def throttle_reasons(self) -> tuple[str, ...]:
        return throttle_reasons(self.throttle_mask)

    @property
    def pcie_link_bytes_per_s(self) -> float | None:
        """At the link's maximum generation and width: the ceiling under load (an idle
        link trains down to save power, so its current speed says little)."""
        return pcie_link_bytes_per_second(self.pcie_max_generation, self.pcie_max_width)


class NvmlReader:
    """Reads one GPU through pynvml."""

    def __init__(self, nvml: ModuleType, handle: Any) -> None:
        self.nvml, self.handle = nvml, handle
        self.name = str(self._get(nvml.nvmlDeviceGetName) or "")
        self.uuid = str(self._get(nvml.nvmlDeviceGetUUID) or "")

    def _get(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(self.handle, *args)
        except self.nvml.NVMLError:  # not supported here (or not now): leave it unset
            return None

    def _throttle_mask(self) -> int | None:
        nvml = self.nvml
        fn = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
        mask = self._get(fn) if fn is not None else None
        if mask is None:  # drivers before the "event reasons" rename
            mask = self._get(nvml.nvmlDeviceGetCurrentClocksThrottleReasons)
        return None if mask is None else int(mask)

    def sample(self) -> GpuSample:
        nvml, get = self.nvml, self._get

        def scaled(value: Any, factor: float) -> float | None:
            return None if value is None else float(value) * factor

        memory = get(nvml.nvmlDeviceGetMemoryInfo)
        util = get(nvml.nvmlDeviceGetUtilizationRates)
        return GpuSample(
            monotonic=time.monotonic(),
            unix=time.time(),
            name=self.name,
            uuid=self.uuid,
            temperature_c=scaled(get(nvml.nvmlDeviceGetTemperature, nvml.NVML_TEMPERATURE_GPU), 1),
            power_w=scaled(get(nvml.nvmlDeviceGetPowerUsage), 1e-3),  # mW
            power_limit_w=scaled(get(nvml.nvmlDeviceGetEnforcedPowerLimit), 1e-3),
            sm_clock_mhz=scaled(get(nvml.nvmlDeviceGetClockInfo, nvml.NVML_CLOCK_SM), 1),
            sm_clock_max_mhz=scaled(get(nvml.nvmlDeviceGetMaxClockInfo, nvml.NVML_CLOCK_SM), 1),
            memory_clock_mhz=scaled(get(nvml.nvmlDeviceGetClockInfo, nvml.NVML_CLOCK_MEM), 1),
            throttle_mask=self._throttle_mask(),
            # NVML reports KB/s (1024 bytes), averaged over ~20 ms.
            pcie_rx_bytes_per_s=scaled(
                get(nvml.nvmlDeviceGetPcieThroughput, nvml.NVML_PCIE_UTIL_RX_BYTES), 1024
            ),
            pcie_tx_bytes_per_s=scaled(
                get(nvml.nvmlDeviceGetPcieThroughput, nvml.NVML_PCIE_UTIL_TX_BYTES), 1024
            ),
            pcie_generation=get(nvml.nvmlDeviceGetCurrPcieLinkGeneration),
            pcie_width=get(nvml.nvmlDeviceGetCurrPcieLinkWidth),
            pcie_max_generation=get(nvml.nvmlDeviceGetMaxPcieLinkGeneration),
            pcie_max_width=get(nvml.nvmlDeviceGetMaxPcieLinkWidth),
            memory_used_bytes=None if memory is None else int(memory.used),
            memory_total_bytes=None if memory is None else int(memory.total),
            utilization=None if util is None else float(util.gpu) / 100,
        )


def _cuda_uuid(index: int) -> str:
    import torch

    uuid = str(torch.cuda.get_device_properties(index).uuid)
    return uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"


def open_nvml(index: int, nvml: ModuleType | None = None) -> tuple[NvmlReader | None, str]:
    """A reader for CUDA device `index` (matched by UUID, so CUDA_VISIBLE_DEVICES and
    device ordering do not matter), or None and why not."""
    if nvml is None:
        try:
            import pynvml
        except ImportError:
            return None, "nvidia-ml-py is not installed (pip install nvidia-ml-py)"
        nvml = pynvml
    try:
        nvml.nvmlInit()
    except Exception as exc:
        return None, f"NVML did not start: {exc}"
    try:
        handle = nvml.nvmlDeviceGetHandleByUUID(_cuda_uuid(index))
    except Exception as exc:
        return None, f"NVML does not know CUDA device {index}: {exc}"
    return NvmlReader(nvml, handle), ""


@dataclass
class Telemetry:
    """Owns the background thread; readers (metrics, health detail) see the latest
    sample, replaced whole each time."""

    engine: Engine
    interval_s: float = 5.0
    fragmentation_threshold: float = 0.3
    nvml: ModuleType | None = None  # tests pass a fake; None: import pynvml
    latest: GpuSample | None = None
    note: str = ""
    throttle_seconds: dict[str, float] = field(default_factory=dict)
    fragmentation_warnings: int = 0
    errors: int = 0
    _reader: NvmlReader | None = None
    _fragmented: bool = False
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __post_init__(self) -> None:
        if self.engine.device.type != "cuda":
            self.note = "no GPU: the engine runs on the CPU"
        elif self.interval_s <= 0:
            self.note = "GPU telemetry is off (--telemetry-interval 0)"
        else:
            self.note = "waiting for the first sample"

    @property
    def enabled(self) -> bool:
        return self.engine.device.type == "cuda" and self.interval_s > 0

    def start(self) -> None:
        if not self.enabled or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="nib-telemetry", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        if self._reader is not None:
            try:
                self._reader.nvml.nvmlShutdown()
            except Exception:
                log.debug("nvmlShutdown failed", exc_info=True)

    def _run(self) -> None:
        device = self.engine.device
        index = device.index if device.index is not None else 0
        self._reader, why = open_nvml(index, self.nvml)
        if self._reader is None:
            self.note = f"no GPU telemetry: {why}"
            log.warning("GPU telemetry off", reason=why)
        else:
            log.info("GPU telemetry on", gpu=self._reader.name, interval_s=self.interval_s)
        while True:
            self.tick()
            if self._stop.wait(self.interval_s):
                return

    def tick(self) -> None:
        """One round: a GPU sample (if NVML is open) and the fragmentation watch."""
        try:
            if self._reader is not None:
                self._record(self._reader.sample())
            if self.engine.ready.is_set() and self.engine.failure is None:
                self._watch_fragmentation()
        except Exception:
            self.errors += 1
            if self.errors == 1 or self.errors % 100 == 0:
                log.warning("GPU telemetry round failed", errors=self.errors, exc_info=True)

    def _record(self, sample: GpuSample) -> None:
        previous, self.latest = self.latest, sample
        self.note = ""
        if previous is None:
            return
        # Time with each reason active, counted in whole sample periods (a gap longer
        # than two periods, e.g. a stalled thread, counts as two).
        elapsed = min(sample.monotonic - previous.monotonic, 2 * self.interval_s)
        for reason in sample.throttle_reasons:
            self.throttle_seconds[reason] = self.throttle_seconds.get(reason, 0.0) + elapsed

    def _watch_fragmentation(self) -> None:
        health = memory_health(self.engine.device, self.engine.graph_pool)
        frag = health.fragmentation
        if frag is None:
            return
        if frag > self.fragmentation_threshold and not self._fragmented:
            self._fragmented = True
            self.fragmentation_warnings += 1
            log.warning(
                "CUDA memory fragmentation above threshold",
                fragmentation=round(frag, 4),
                threshold=self.fragmentation_threshold,
                allocated_bytes=health.allocated,
                reserved_bytes=health.reserved,
            )
        elif frag <= self.fragmentation_threshold and self._fragmented:
            self._fragmented = False
            log.info("CUDA memory fragmentation back below threshold", fragmentation=frag)
