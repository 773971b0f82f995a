"""A real `nib serve` on the GPU, as an operator sees it: NVML telemetry and memory health
in the metrics, `nib health --verbose` with the self-check, kernels, graphs and GPU state;
and a server whose self-check was fed a corrupted kernel input stays NOT_SERVING, saying
which kernel failed."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nib.sdk.health_report import fetch_health_detail
from nib.v1 import completion_pb2 as pb
from tests.integration.conftest import start_server, stop_server, wait_for
from tests.integration.metrics_util import parse, value

from .models import save_random_hf_model

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_random_hf_model("llama", tmp_path_factory.mktemp("llama"), layers=2)


def test_gpu_server_reports_telemetry_and_health(model_dir: Path, tmp_path: Path) -> None:
    assert importlib.util.find_spec("pynvml"), "nvidia-ml-py, a server dependency, is missing"
    server = start_server(
        model_dir,
        tmp_path / "server.log",
        "--device",
        "cuda",
        "--max-context",
        "256",
        "--telemetry-interval",
        "0.5",
        metrics=True,
    )
    try:
        dev = "cuda"

        def sampled() -> bool:
            return ("nib_gpu_temperature_celsius", frozenset({("device", dev)})) in parse(
                server.metrics()
            )

        wait_for(sampled, 30, "an NVML sample in the metrics")
        s = parse(server.metrics())
        assert 0 < value(s, "nib_gpu_temperature_celsius", device=dev) < 120
        assert value(s, "nib_gpu_power_limit_watts", device=dev) > 0
        assert value(s, "nib_gpu_sm_clock_hertz", device=dev) > 1e8
        assert value(s, "nib_gpu_memory_used_bytes", device=dev) > 0
        link = value(s, "nib_gpu_pcie_link_bytes_per_second", device=dev)
        assert link > 1e9, "PCIe link bandwidth from NVML's generation and width"
        reasons = {dict(k[1])["reason"] for k in s if k[0] == "nib_gpu_throttle_active"}
        assert {"sw_power_cap", "hw_thermal_slowdown", "gpu_idle"} <= reasons
        assert value(s, "nib_cuda_graph_pool_bytes", device=dev) > 0
        frag = ("nib_cuda_memory_fragmentation_ratio", frozenset({("device", dev)}))
        assert frag in s and 0 <= s[frag] <= 1
        gemv = ("nib_kernel_fallbacks_total", frozenset({("kernel", "gemv")}))
        assert gemv in s and s[gemv] == 0  # present (a GPU engine), and no fallback
        out = subprocess.run(
            [sys.executable, "-m", "nib.sdk.cli", "health", "--verbose"],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "NIB_ADDRESS": server.address},
        )
        assert out.returncode == 0, out.stderr
        text = out.stdout
        print(text)  # the GPU run's log keeps what an operator would see
        assert "state       serving · kernels: triton" in text
        assert "self-check  passed:" in text and " kernel checks passed in " in text
        assert "°C" in text and "throttling:" in text and "PCIe gen" in text
        assert "graph pool" in text and "(snapshot)" in text
        detail = fetch_health_detail(server.address, 10)
        assert detail.self_check.status == pb.SELF_CHECK_STATUS_PASSED
        assert detail.graphs and all(g.ready for g in detail.graphs)
        assert detail.gpu.HasField("temperature_celsius")
        report = [e for e in server.events() if e.get("event") == "startup report"]
        assert len(report) == 1 and report[0]["kernel_mode"] == "triton"
    finally:
        stop_server(server)


def test_server_with_a_corrupted_kernel_stays_not_serving(model_dir: Path, tmp_path: Path) -> None:
    server = start_server(
        model_dir,
        tmp_path / "server.log",
        "--device",
        "cuda",
        "--max-context",
        "256",
        "--quant",
        "int4",
        env={"NIB_FAULT_INJECTION": "corrupt_kernel=int4_linear"},
        wait_serving=False,
    )
    try:
        details: list[pb.GetHealthDetailResponse] = []

        def failed() -> bool:
            details.append(fetch_health_detail(server.address, 10))
            return details[-1].state == pb.SERVER_STATE_FAILED

        wait_for(failed, 300, "the engine to refuse")
        detail = details[-1]
        assert detail.self_check.status == pb.SELF_CHECK_STATUS_FAILED
        bad = [c for c in detail.self_check.checks if not c.passed]
        assert bad and {c.kernel for c in bad} == {"int4_linear"}
        assert "kernel self-check failed, refusing to serve: int4_linear [rows=" in detail.error
        from nib.sdk import Client

        with Client(server.address) as client:
            assert client.health() == "NOT_SERVING"
        failures = [e for e in server.events() if e.get("event") == "engine failed to start"]
        assert len(failures) == 1 and "int4_linear" in str(failures[0].get("exception"))
    finally:
        stop_server(server)
