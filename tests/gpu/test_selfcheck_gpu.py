"""The start-up report on a real GPU: the kernel self-check passes on every path the engine
runs (16-bit and INT4), and a deliberately corrupted kernel input (the INT4 scales or a
16-bit weight in the wrong layout, injected through the self-check's test hook) makes the
engine refuse to serve, naming the kernel, the shape and the error. Also: versions, kernel
paths, the graph pool, fragmentation, and the compute-capability floor with and without
--allow-reference-fallback."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from nib.engine import versions
from nib.engine.cuda import loader
from nib.engine.engine import Engine, EngineConfig
from nib.engine.errors import EngineUnavailable
from nib.engine.health import engine_health
from nib.engine.hooks import EngineHooks
from nib.engine.request import GenerationParams
from nib.engine.selfcheck import SelfCheckFailed, SelfCheckStatus
from nib.engine.startup import GPU_KERNELS
from nib.service.faults import FaultPlan

from .models import save_random_hf_model
from .test_decode_core import PROMPT, generate

pytestmark = pytest.mark.gpu
CONTEXT = 256  # few graphs: the tests start several engines


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_random_hf_model("qwen2", tmp_path_factory.mktemp("qwen2"), layers=2)


def start(model_dir: Path, hooks: EngineHooks | None = None, **kw: object) -> Engine:
    config = EngineConfig(model_dir=model_dir, device="cuda", max_context=CONTEXT, **kw)  # type: ignore[arg-type]
    return Engine(config, hooks).start()


def wait_failed(engine: Engine, timeout: float = 300) -> BaseException:
    engine._thread.join(timeout)
    assert not engine.alive, "the engine did not stop"
    assert not engine.ready.is_set() and engine.failure is not None
    return engine.failure


@pytest.fixture(scope="module")
def bf16(model_dir: Path) -> Iterator[Engine]:
    engine = start(model_dir, tune_kernels=False)
    assert engine.wait_ready(300), engine.failure
    yield engine
    engine.stop()


@pytest.fixture(scope="module")
def int4(model_dir: Path) -> Iterator[Engine]:
    engine = start(model_dir, quant="int4", tune_kernels=False)
    assert engine.wait_ready(300), engine.failure
    yield engine
    engine.stop()


def test_self_check_passes_on_every_16bit_path(bf16: Engine) -> None:
    report = bf16.selfcheck
    assert report.status is SelfCheckStatus.PASSED, report.summary()
    kernels = {c.kernel for c in report.checks}
    assert kernels >= {"rms_norm", "add_rms_norm", "rope_cache", "silu_mul", "linear"}
    assert kernels >= {"decode_attention", "prefill_attention", "exp_noise", "sampling"}
    # Batch 1 runs the GEMV with its glue folded in; more rows run cuBLAS.
    paths = {c.path for c in report.checks if c.kernel == "linear"}
    assert {"gemv-4x512w4 +norm", "gemv-4x512w4 +norm_glu", "cublas"} <= paths
    multi = [c for c in report.checks if c.shape.startswith("queries=128")]
    assert multi, "the multi-query (chunk) attention was not checked"


def test_self_check_passes_on_every_int4_path(int4: Engine) -> None:
    report = int4.selfcheck
    assert report.status is SelfCheckStatus.PASSED, report.summary()
    int4_checks = [c for c in report.checks if c.kernel == "int4_linear"]
    paths = {c.path.split()[1] for c in int4_checks}  # "int4 mma16 r1w4p4 +norm" -> mma16
    # Decode and the 2..16-row graphs: nib's CUDA tensor-core kernel where nvcc built it,
    # else the Triton batch-1 GEMV and the Triton tensor-core kernel.
    cuda = loader.available(torch.device("cuda"))
    batch1, multi = ("mma16", "mma16") if cuda else ("gemv1", "mma")
    assert {batch1, multi} <= paths, paths
    fused = {c.path.split()[-1] for c in int4_checks if c.path.split()[1] == batch1}
    assert {"+norm", "+norm_glu", "+residual"} <= fused, fused
    assert all(c.error <= c.tolerance for c in int4_checks)
    from nib.engine.kernel_paths import PICK_FUSED

    # The decode graphs keep the pick a kernel of its own by default: nothing fused to check.
    assert not [c for c in report.checks if c.path == PICK_FUSED]
    linear = [p for p in int4.kernel_paths if p.op == "linear"]
    assert linear and all(p.kernel.startswith("int4 ") for p in linear)
    assert all(p.graphs for p in linear)
    slow = [(p.layer, p.rows, p.kernel) for p in linear if p.fallback]
    assert not slow, f"INT4 kernels fell back to slower paths on this GPU: {slow}"


def test_versions_paths_and_memory_are_reported(bf16: Engine) -> None:
    v = bf16.info().versions
    assert v is not None
    major, minor = torch.cuda.get_device_capability()
    assert v.gpu == torch.cuda.get_device_name() and v.compute_capability == f"{major}.{minor}"
    assert v.min_compute_capability == "8.0" and v.cuda_runtime == torch.version.cuda
    assert v.kernels_build.startswith("src-") and v.cuda_driver
    paths = {(p.layer, p.op, p.rows): p for p in bf16.info().kernel_paths}
    qkv = paths[("layers.0-1.attention.wqkv", "linear", "1")]
    assert qkv.kernel == "gemv-4x512w4 +norm" and qkv.graphs == "decode" and not qkv.fallback
    health = engine_health(bf16)
    assert health.state == "ready" and health.kernel_mode == "triton"
    assert set(health.kernel_fallbacks) >= set(GPU_KERNELS)
    # (INT4 fallbacks are counted per process: the INT4 test checks its own paths.)
    sixteen_bit = {k: n for k, n in health.kernel_fallbacks.items() if not k.startswith("int4")}
    assert all(n == 0 for n in sixteen_bit.values()), health.kernel_fallbacks
    memory = health.memory
    assert memory is not None and memory.graph_pool is not None
    pool = memory.graph_pool
    assert pool.method == "snapshot", "torch's snapshot lacks pool ids: method falls back"
    # Its intermediates are free between replays (not allocated) but stay reserved for it.
    assert 0 < pool.reserved <= memory.reserved and 0 <= pool.allocated <= pool.reserved
    assert memory.fragmentation is not None and 0 <= memory.fragmentation <= 1
    assert all(g.ready and g.capture_ms > 0 for g in health.graphs)


def test_fragmentation_warning(bf16: Engine) -> None:
    from nib.service.telemetry import Telemetry

    telemetry = Telemetry(bf16, interval_s=1.0, fragmentation_threshold=0.01)
    scratch = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    del scratch  # reserved, no longer allocated: fragmentation well above 1%
    telemetry.tick()
    assert telemetry.fragmentation_warnings == 1
    telemetry.tick()
    assert telemetry.fragmentation_warnings == 1  # once per crossing
    torch.cuda.empty_cache()


@pytest.mark.parametrize(
    ("quant", "kernel"), [("int4", "int4_linear"), ("none", "linear")], ids=["int4", "bf16"]
)
def test_corrupted_kernel_input_refuses_to_serve(model_dir: Path, quant: str, kernel: str) -> None:
    """The INT4 scales (or a 16-bit weight) reach the kernel in the wrong layout; the
    reference reads them right. The engine must not report ready."""
    hooks = FaultPlan(corrupt_kernel=kernel).hooks(None)
    engine = start(model_dir, hooks, quant=quant, tune_kernels=False)
    failure = wait_failed(engine)
    assert isinstance(failure, SelfCheckFailed), failure
    report = engine.selfcheck
    assert report.status is SelfCheckStatus.FAILED
    assert {c.kernel for c in report.failures} == {kernel}
    assert all(c.passed for c in report.checks if c.kernel != kernel)
    first = report.failures[0]
    assert first.error > 0.1 and "relative error" in first.message
    message = str(failure)
    assert f"{kernel} [{first.shape}]" in message and "rows=1 out=" in message
    with pytest.raises(EngineUnavailable, match="SelfCheckFailed"):
        engine.submit(PROMPT, GenerationParams(max_tokens=4), lambda e: None, "x")
    health = engine_health(engine)
    assert health.state == "failed" and "refusing to serve" in health.error
    assert engine.runner is not None and not any(s.ready for s in engine.runner.states.values())


def test_below_the_compute_capability_floor(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(versions, "MIN_COMPUTE_CAPABILITY", (99, 0))
    refused = start(model_dir)
    failure = wait_failed(refused)
    assert isinstance(failure, versions.UnsupportedDevice)
    assert "need 99.0 or newer" in str(failure)
    assert "--allow-reference-fallback" in str(failure)
    allowed = start(model_dir, quant="int4", allow_reference_fallback=True)
    try:
        assert allowed.wait_ready(300), allowed.failure
        assert allowed.kernel_mode == "reference" and allowed.runner is None
        assert allowed.selfcheck.status is SelfCheckStatus.NOT_RUN
        assert all(p.fallback for p in allowed.kernel_paths)
        assert engine_health(allowed).kernel_fallbacks == dict.fromkeys(GPU_KERNELS, 1)
        tokens, done = generate(allowed, PROMPT, GenerationParams(max_tokens=8))
        assert len(tokens) == 8, done
    finally:
        allowed.stop()
