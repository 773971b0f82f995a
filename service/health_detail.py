"""GetHealthDetail's answer: the engine's health snapshot, the latest GPU sample and the
server's own state, converted to protobuf at the service edge."""

from __future__ import annotations

import time

from nib.engine.engine import Engine
from nib.engine.health import EngineHealth, engine_health
from nib.engine.memory import MemoryHealth
from nib.engine.selfcheck import SelfCheckReport, SelfCheckStatus
from nib.service.convert import kernel_paths_to_pb, versions_to_pb
from nib.service.telemetry import GpuSample, Telemetry
from nib.v1 import completion_pb2 as pb

_STATES = {
    "starting": pb.SERVER_STATE_STARTING,
    "ready": pb.SERVER_STATE_SERVING,
    "failed": pb.SERVER_STATE_FAILED,
    "stopped": pb.SERVER_STATE_STOPPED,
}
_SELF_CHECK = {
    SelfCheckStatus.NOT_RUN: pb.SELF_CHECK_STATUS_NOT_RUN,
    SelfCheckStatus.PENDING: pb.SELF_CHECK_STATUS_PENDING,
    SelfCheckStatus.PASSED: pb.SELF_CHECK_STATUS_PASSED,
    SelfCheckStatus.FAILED: pb.SELF_CHECK_STATUS_FAILED,
}


def self_check_to_pb(report: SelfCheckReport) -> pb.SelfCheck:
    return pb.SelfCheck(
        status=_SELF_CHECK[report.status],
        note=report.headline(),
        duration_ms=report.seconds * 1e3,
        checks=[
            pb.KernelCheck(
                kernel=c.kernel,
                shape=c.shape,
                path=c.path,
                passed=c.passed,
                error=c.error,
                tolerance=c.tolerance,
                message=c.message,
                duration_ms=c.ms,
            )
            for c in report.checks
        ],
    )


def gpu_to_pb(s: GpuSample, now: float) -> pb.GpuState:
    out = pb.GpuState(age_seconds=max(0.0, now - s.monotonic))
    out.throttle_reasons.extend(s.throttle_reasons)
    optional = {
        "temperature_celsius": s.temperature_c,
        "power_watts": s.power_w,
        "power_limit_watts": s.power_limit_w,
        "sm_clock_mhz": s.sm_clock_mhz,
        "sm_clock_max_mhz": s.sm_clock_max_mhz,
        "memory_clock_mhz": s.memory_clock_mhz,
        "pcie_rx_bytes_per_second": s.pcie_rx_bytes_per_s,
        "pcie_tx_bytes_per_second": s.pcie_tx_bytes_per_s,
        "pcie_link_bytes_per_second": s.pcie_link_bytes_per_s,
        "pcie_generation": s.pcie_generation,
        "pcie_width": s.pcie_width,
        "pcie_max_generation": s.pcie_max_generation,
        "pcie_max_width": s.pcie_max_width,
        "memory_used_bytes": s.memory_used_bytes,
        "memory_total_bytes": s.memory_total_bytes,
        "utilization": s.utilization,
    }
    for name, value in optional.items():
        if value is not None:  # unset, not 0, when the GPU did not report it
            setattr(out, name, value)
    return out


def memory_to_pb(m: MemoryHealth, threshold: float) -> pb.MemoryHealth:
    out = pb.MemoryHealth(
        allocated_bytes=m.allocated,
        reserved_bytes=m.reserved,
        graph_pool_bytes=m.graph_pool.reserved if m.graph_pool else 0,
        graph_pool_method=m.graph_pool.method if m.graph_pool else "",
        fragmentation_threshold=threshold,
    )
    if m.fragmentation is not None:
        out.fragmentation = m.fragmentation
    return out


def health_detail_to_pb(
    health: EngineHealth,
    telemetry: Telemetry,
    *,
    draining: bool,
    model: str,
    device: str,
    server_version: str,
) -> pb.GetHealthDetailResponse:
    state = _STATES[health.state]
    if draining and state == pb.SERVER_STATE_SERVING:
        state = pb.SERVER_STATE_DRAINING
    out = pb.GetHealthDetailResponse(
        state=state,
        error=health.error,
        kernel_mode=health.kernel_mode,
        self_check=self_check_to_pb(health.self_check),
        graphs=[
            pb.GraphInfo(
                name=g.name,
                ready=g.ready,
                fallback=g.fallback,
                capture_ms=g.capture_ms,
                error=g.error,
                eager_runs=g.eager_runs,
            )
            for g in health.graphs
        ],
        kernel_paths=kernel_paths_to_pb(health.kernel_paths),
        kernel_fallbacks=health.kernel_fallbacks,
        versions=versions_to_pb(health.versions),
        telemetry_note=telemetry.note,
        model=model,
        device=device,
        server_version=server_version,
    )
    sample = telemetry.latest
    if sample is not None:
        out.gpu.CopyFrom(gpu_to_pb(sample, time.monotonic()))
    if health.memory is not None:
        out.memory.CopyFrom(memory_to_pb(health.memory, telemetry.fragmentation_threshold))
    return out


def build(
    engine: Engine, telemetry: Telemetry, *, draining: bool, server_version: str
) -> pb.GetHealthDetailResponse:
    info = engine.info()
    health = engine_health(engine)
    return health_detail_to_pb(
        health,
        telemetry,
        draining=draining,
        model=info.model,
        device=info.device,
        server_version=server_version,
    )
