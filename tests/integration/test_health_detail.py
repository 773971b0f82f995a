"""The health detail of a real CPU server, as an operator gets it: `nib health --verbose`,
the GetHealthDetail RPC through grpcurl, model-info's versions and kernel paths, and GPU
telemetry absent (declared, no samples) from the metrics."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import version

import grpc
import torch

from nib.v1 import completion_pb2 as pb
from nib.v1 import completion_pb2_grpc as pb_grpc

from .conftest import ServerProcess, grpcurl
from .metrics_util import declared, parse

LINEARS = ("attention.wqkv", "attention.wo", "feed_forward.w_gate_up", "feed_forward.w_down")


def call(server: ServerProcess) -> tuple[pb.GetHealthDetailResponse, pb.GetModelInfoResponse]:
    with grpc.insecure_channel(server.address) as channel:
        stub = pb_grpc.CompletionServiceStub(channel)
        detail = stub.GetHealthDetail(pb.GetHealthDetailRequest(), timeout=30)
        info = stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=30)
    return detail, info


def test_detail_of_a_cpu_server(fast_server: ServerProcess) -> None:
    detail, info = call(fast_server)
    assert detail.state == pb.SERVER_STATE_SERVING and detail.error == ""
    assert detail.kernel_mode == "cpu" and detail.device == "cpu"
    assert detail.self_check.status == pb.SELF_CHECK_STATUS_NOT_RUN
    assert detail.self_check.note == "the CPU engine runs the PyTorch references"
    assert not detail.self_check.checks and not detail.graphs
    assert not detail.kernel_fallbacks  # no kernels to fall back from: absent
    assert not detail.HasField("gpu") and not detail.HasField("memory")
    assert detail.telemetry_note == "no GPU: the engine runs on the CPU"
    v = detail.versions
    assert v.nib == version("nib") and v.torch == torch.__version__
    assert v.python == ".".join(map(str, sys.version_info[:3]))
    assert v.gpu == v.compute_capability == v.kernels_build == ""
    # Every layer's linear is named, merged over the layers (all alike on the CPU).
    layers = {(p.layer, p.op): p for p in detail.kernel_paths}
    ranges = {
        p.layer.split(".", 2)[1] for p in detail.kernel_paths if p.layer.startswith("layers.")
    }
    assert len(ranges) == 1  # e.g. "0-1": every layer in one entry
    span = ranges.pop()
    for name in LINEARS:
        path = layers[(f"layers.{span}.{name}", "linear")]
        assert (path.kernel, path.rows, path.fallback) == ("torch linear", "any", False)
    assert layers[("output", "linear")].kernel == "torch linear"
    assert {op for _, op in layers} >= {"rms_norm", "rope_cache", "silu_mul", "attention"}
    # model-info carries the same versions and kernel paths.
    assert info.versions == detail.versions
    assert list(info.kernel_paths) == list(detail.kernel_paths)
    assert detail.server_version == info.server_version == version("nib")


def test_nib_health_verbose_is_readable(fast_server: ServerProcess) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "nib.sdk.cli", "health", "--verbose"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "NIB_ADDRESS": fast_server.address},
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "SERVING"
    assert lines[1].split() == ["state", "serving", "·", "kernels:", "cpu"]
    text = out.stdout
    assert f"torch {torch.__version__}" in text
    assert "gpu         no GPU: the engine runs on the CPU" in text
    assert "self-check  not run: the CPU engine runs the PyTorch references" in text
    assert "graphs      none (no CUDA graphs)" in text
    head = next(line for line in lines if line.lstrip().startswith("output "))
    assert head.split() == ["output", "linear", "rows", "any", "torch", "linear"]


def test_grpcurl_reads_the_detail_without_a_proto(fast_server: ServerProcess) -> None:
    out = grpcurl("-plaintext", fast_server.address, "nib.v1.CompletionService/GetHealthDetail")
    assert out.returncode == 0, out.stderr
    body = json.loads(out.stdout)
    assert body["state"] == "SERVER_STATE_SERVING"
    assert body["self_check"]["status"] == "SELF_CHECK_STATUS_NOT_RUN"
    assert "gpu" not in body and body["telemetry_note"].startswith("no GPU")


def test_gpu_telemetry_is_absent_not_zero(fast_server: ServerProcess) -> None:
    text = fast_server.metrics()
    samples = parse(text)
    names = declared(text)
    for name in (
        "nib_gpu_info",
        "nib_gpu_temperature_celsius",
        "nib_gpu_power_watts",
        "nib_gpu_power_limit_watts",
        "nib_gpu_sm_clock_hertz",
        "nib_gpu_memory_clock_hertz",
        "nib_gpu_throttle_active",
        "nib_gpu_throttle_seconds",
        "nib_gpu_pcie_rx_bytes_per_second",
        "nib_gpu_pcie_tx_bytes_per_second",
        "nib_gpu_pcie_link_bytes_per_second",
        "nib_gpu_memory_used_bytes",
        "nib_gpu_telemetry_errors",
        "nib_cuda_graph_pool_bytes",
        "nib_cuda_memory_fragmentation_ratio",
        "nib_cuda_memory_fragmentation_warnings",
        "nib_kernel_fallbacks",
    ):
        assert name in names, name
        assert not [k for k in samples if k[0].startswith(name)], name
