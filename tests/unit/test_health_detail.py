"""The health detail, from the engine's snapshot to protobuf to the text `nib health
--verbose` prints: a GPU engine whose self-check failed, with a throttling GPU."""

from __future__ import annotations

import math
import time
from types import SimpleNamespace

from nib.engine.health import EngineHealth, GraphDetail
from nib.engine.kernel_paths import KernelPath
from nib.engine.memory import MemoryHealth, PoolUsage
from nib.engine.selfcheck import KernelCheck, SelfCheckReport, SelfCheckStatus
from nib.engine.versions import Versions
from nib.sdk.health_report import format_health_detail
from nib.service.health_detail import health_detail_to_pb
from nib.service.telemetry import GpuSample
from nib.v1 import completion_pb2 as pb

VERSIONS = Versions(
    nib="0.1.0",
    python="3.12.3",
    torch="2.11.0+cu130",
    cuda_runtime="13.0",
    cuda_driver="13.0",
    nvidia_driver="580.159",
    triton="3.6.0",
    gpu="NVIDIA H200",
    compute_capability="9.0",
    min_compute_capability="8.0",
    kernels_build="src-0123456789ab triton-3.6.0",
)
FAILED_CHECK = KernelCheck(
    "int4_linear",
    "rows=1 out=1536 in=512 (layers.0.attention.wo)",
    "int4 gemv m1 n4g2 s1 w4 st2 asm",
    False,
    1.41,
    5e-3,
    "relative error 1.41 > tolerance 5.0e-03",
    3.0,
)
PASSED_CHECK = KernelCheck("rms_norm", "rows=1 hidden=512", "triton", True, 1e-3, 2e-2, "", 1.0)


def health(**overrides: object) -> EngineHealth:
    base = dict(
        state="failed",
        error="SelfCheckFailed: kernel self-check failed, refusing to serve: ...",
        kernel_mode="triton",
        self_check=SelfCheckReport(SelfCheckStatus.FAILED, "", (PASSED_CHECK, FAILED_CHECK), 0.5),
        graphs=(
            GraphDetail("decode-greedy-0", True, False, 12.5, "", 0),
            GraphDetail("prefill-2048-sample", False, True, 40.0, "RuntimeError: oom", 3),
        ),
        kernel_paths=(
            KernelPath(
                "layers.0-3.attention.wo", "linear", "1", "int4 dequant+cublas", "decode", True
            ),
            KernelPath("layers.0-3", "rms_norm", "any", "triton rms_norm", "all"),
        ),
        kernel_fallbacks={"int4_gemv": 2, "rms_norm": 0},
        versions=VERSIONS,
        memory=MemoryHealth(3 << 30, 4 << 30, PoolUsage(512 << 20, 100 << 20, "snapshot"), 0.42),
    )
    base.update(overrides)
    return EngineHealth(**base)  # type: ignore[arg-type]


def telemetry(sample: GpuSample | None, note: str = "") -> SimpleNamespace:
    return SimpleNamespace(latest=sample, note=note, fragmentation_threshold=0.3)


SAMPLE = GpuSample(
    monotonic=time.monotonic(),
    unix=time.time(),
    name="NVIDIA H200",
    temperature_c=83.0,
    power_w=690.0,
    power_limit_w=700.0,
    sm_clock_mhz=1410.0,
    sm_clock_max_mhz=1980.0,
    memory_clock_mhz=3201.0,
    throttle_mask=0x4 | 0x20,
    pcie_rx_bytes_per_s=50e9,
    pcie_tx_bytes_per_s=1e6,
    pcie_generation=5,
    pcie_width=16,
    pcie_max_generation=5,
    pcie_max_width=16,
    memory_used_bytes=20 << 30,
    memory_total_bytes=141 << 30,
)


def test_failed_gpu_engine_in_protobuf() -> None:
    d = health_detail_to_pb(
        health(),
        telemetry(SAMPLE),  # type: ignore[arg-type]
        draining=False,
        model="qwen",
        device="cuda:0",
        server_version="0.1.0",
    )
    assert d.state == pb.SERVER_STATE_FAILED and d.error.startswith("SelfCheckFailed")
    assert d.self_check.status == pb.SELF_CHECK_STATUS_FAILED
    failed = [c for c in d.self_check.checks if not c.passed]
    assert [(c.kernel, c.shape) for c in failed] == [(FAILED_CHECK.kernel, FAILED_CHECK.shape)]
    assert d.graphs[1].fallback and d.graphs[1].eager_runs == 3
    assert d.kernel_paths[0].fallback and d.kernel_fallbacks["int4_gemv"] == 2
    assert d.versions.gpu == "NVIDIA H200" and d.versions.kernels_build.startswith("src-")
    assert list(d.gpu.throttle_reasons) == ["sw_power_cap", "sw_thermal_slowdown"]
    assert d.gpu.pcie_link_bytes_per_second > 60e9
    assert not d.gpu.HasField("utilization")  # not reported: unset, not 0
    assert d.memory.graph_pool_bytes == 512 << 20 and d.memory.fragmentation == 0.42


def test_draining_and_cpu_without_gpu_fields() -> None:
    d = health_detail_to_pb(
        health(state="ready", error="", memory=None, graphs=(), kernel_fallbacks={}),
        telemetry(None, "no GPU: the engine runs on the CPU"),  # type: ignore[arg-type]
        draining=True,
        model="m",
        device="cpu",
        server_version="0.1.0",
    )
    assert d.state == pb.SERVER_STATE_DRAINING
    assert not d.HasField("gpu") and not d.HasField("memory")
    assert d.telemetry_note == "no GPU: the engine runs on the CPU"


def test_the_report_a_person_reads() -> None:
    d = health_detail_to_pb(
        health(),
        telemetry(SAMPLE),  # type: ignore[arg-type]
        draining=False,
        model="qwen",
        device="cuda:0",
        server_version="0.1.0",
    )
    text = format_health_detail(d)
    lines = text.splitlines()
    assert lines[0].split() == ["state", "failed", "·", "kernels:", "triton"]
    assert lines[1].startswith("error       SelfCheckFailed")
    assert "NVIDIA H200 · compute capability 9.0 (kernels need >= 8.0) · driver 580.159" in text
    assert "kernels src-0123456789ab triton-3.6.0" in text
    assert "83 °C · 690/700 W · SM 1410 MHz (max 1980)" in text
    assert "throttling: sw_power_cap, sw_thermal_slowdown" in text
    assert "PCIe gen5 x16 (max gen5 x16, 63.0 GB/s per direction) · rx 50.0 GB/s" in text
    assert "fragmentation 42.0% (warns above 30%)  HIGH" in text
    assert "graph pool 512.0 MiB (snapshot)" in text
    fail_line = next(line for line in lines if line.lstrip().startswith("FAIL"))
    assert "int4_linear" in fail_line and "rows=1 out=1536 in=512" in fail_line
    assert "relative error 1.41 > tolerance" in fail_line
    assert any(line.lstrip().startswith("ok") and "rms_norm" in line for line in lines)
    wo = next(line for line in lines if "layers.0-3.attention.wo" in line)
    assert "int4 dequant+cublas  FALLBACK" in wo and "[decode]" in wo
    assert "fallbacks   int4_gemv 2" in text
    assert "graphs      1/2 captured" in text
    eager = next(line for line in lines if "prefill-2048-sample" in line)
    assert eager.lstrip().startswith("EAGER") and "ran eagerly 3x RuntimeError: oom" in eager
    assert math.isfinite(d.self_check.duration_ms)
