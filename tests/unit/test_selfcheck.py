"""The start-up kernel self-check on the CPU, through the Triton interpreter: every
kernel path passes against its reference, and a corrupted kernel input (the fault
plan's wrong layout) fails the check with the kernel, the shape and the error named.
tests/gpu repeats this compiled, with INT4, inside a starting engine."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

triton = pytest.importorskip("triton")

from nib.engine.kernels.decode_attention import DecodeAttention  # noqa: E402
from nib.engine.selfcheck import (  # noqa: E402
    Case,
    SelfCheckFailed,
    SelfCheckStatus,
    relative_error,
    run_self_check,
)
from nib.engine.selfcheck_cases import _check_noise, build_cases  # noqa: E402
from nib.service.faults import FaultPlan, wrong_layout  # noqa: E402

from .hf_models import save_hf_model  # noqa: E402

CPU = torch.device("cpu")
CONTEXT = 64
ROWS = (1, 4, 8, 16, 32, 64)  # what a GraphRunner for this context feeds its layers


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> list[Case]:
    from nib.engine.kernels.gemv import swap_in_gemv
    from nib.engine.loader import load_model
    from nib.engine.ops import TritonOps

    folder = Path(tmp_path_factory.mktemp("qwen2"))
    save_hf_model("qwen2-bias-untied", folder)
    model = load_model(folder, device=CPU)
    model.setup_cache(CONTEXT)
    model.ops = TritonOps()
    swap_in_gemv(model, tune=False)
    cfg = model.cfg
    decode = DecodeAttention(cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, CONTEXT, CPU)
    multi = DecodeAttention(
        cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, CONTEXT, CPU, max_queries=8
    )
    return build_cases(model, ROWS, decode, multi)


def test_every_kernel_path_agrees_with_its_reference(cases: list[Case]) -> None:
    report = run_self_check(cases)
    assert report.status is SelfCheckStatus.PASSED, report.summary()
    kernels = {c.kernel for c in report.checks}
    assert kernels == {
        "rms_norm",
        "add_rms_norm",
        "rope_cache",
        "silu_mul",
        "linear",
        "decode_attention",
        "prefill_attention",
        "exp_noise",
        "sampling",
    }
    linear = [c for c in report.checks if c.kernel == "linear"]
    # Each of the five shapes (qkv with bias, o, gate_up, down, lm_head) at one row (the
    # GEMV with its glue folded in) and at several (cuBLAS).
    assert {c.path for c in linear} == {
        "gemv-4x512w4 +norm",
        "gemv-4x512w4 +residual",
        "gemv-4x512w4 +norm_glu",
        "cublas",
    }
    assert len({c.shape.split(" (")[0].split(" ", 1)[1] for c in linear}) == 5
    assert all(c.error <= c.tolerance for c in report.checks)
    assert "passed" in report.summary()


@pytest.mark.parametrize(
    "kernel",
    [
        "linear",
        "rms_norm",
        "add_rms_norm",
        "rope_cache",
        "silu_mul",
        "decode_attention",
        "prefill_attention",
        "sampling",
    ],
)
def test_a_corrupted_kernel_input_fails_the_check(cases: list[Case], kernel: str) -> None:
    tamper = FaultPlan(corrupt_kernel=kernel).hooks(None).tamper_selfcheck
    mine = [c for c in cases if c.kernel == kernel]
    others = [c for c in cases if c.kernel != kernel][:3]
    report = run_self_check(mine + others, tamper)
    assert report.status is SelfCheckStatus.FAILED
    assert {c.kernel for c in report.failures} == {kernel}
    assert len(report.failures) == len(mine)  # every shape of it, none of the others
    message = str(SelfCheckFailed(report))
    first = report.failures[0]
    assert message.startswith("kernel self-check failed, refusing to serve: ")
    assert f"{kernel} [{first.shape}]" in message
    assert first.message in message
    if kernel != "sampling":
        assert "relative error" in first.message and first.error > first.tolerance


def test_a_kernel_that_raises_fails_with_its_error() -> None:
    def broken(inputs: dict[str, object]) -> torch.Tensor:
        raise RuntimeError("illegal instruction")

    case = Case("gemv", "rows=1 out=8 in=8", lambda: {}, broken, lambda i: torch.zeros(8), 1e-3)
    report = run_self_check([case])
    (check,) = report.failures
    assert math.isinf(check.error)
    assert check.message == "raised RuntimeError: illegal instruction"
    assert "gemv [rows=1 out=8 in=8]: raised RuntimeError: illegal instruction" in str(
        SelfCheckFailed(report)
    )


def test_relative_error_catches_nan_and_wrong_shapes() -> None:
    ref = torch.ones(4)
    assert relative_error(ref * 1.001, ref)[0] == pytest.approx(1e-3, rel=1e-3)
    nan = torch.tensor([1.0, float("nan"), 1.0, 1.0])
    assert relative_error(nan, ref) == (
        math.inf,
        "output 0 has NaN/inf where the reference is finite",
    )
    assert "has shape (2,), expected (4,)" in relative_error(torch.ones(2), ref)[1]


def test_noise_check_rejects_wrong_distributions() -> None:
    g = torch.Generator().manual_seed(0)
    good = torch.empty(1 << 16).exponential_(generator=g)
    nxt = torch.empty(1 << 16).exponential_(generator=g)
    assert _check_noise((good, good.clone(), nxt), ())[0] < 0.03
    uniform = torch.rand(1 << 16, generator=g)  # mean 0.5: not Exp(1)
    assert _check_noise((uniform, uniform.clone(), nxt), ())[0] > 0.3
    assert _check_noise((good, nxt, nxt), ())[1] == "the same seed and step gave different noise"
    assert _check_noise((good, good.clone(), good.clone()), ())[1] == (
        "the next step gave the same noise"
    )


def test_report_lists_at_most_three_failures_in_the_message() -> None:
    cases = [
        Case("k", f"n={i}", lambda: {}, lambda i: torch.ones(2), lambda i: torch.zeros(2), 0.1)
        for i in range(5)
    ]
    report = run_self_check(cases)
    assert "and 2 more" in str(SelfCheckFailed(report))
    assert len(report.failures) == 5


def test_wrong_layout_really_changes_the_values() -> None:
    scales = torch.arange(12.0).view(3, 4)  # [K/128, N]
    wrong = wrong_layout(scales)
    assert wrong.shape == scales.shape and not torch.equal(wrong, scales)
    assert torch.equal(wrong_layout(torch.arange(4.0)), torch.tensor([3.0, 2.0, 1.0, 0.0]))
