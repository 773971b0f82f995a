"""The start-up kernel self-check: every kernel path the engine will use, once, against
its PyTorch reference on random inputs, before the engine reports ready.

A kernel that compiles but computes the wrong thing (a layout mismatch, a bad
tuned configuration, a driver or compiler bug on this GPU) would otherwise serve
plausible-looking garbage. Each `Case` builds its inputs from a seeded generator,
runs the reference and the kernel on separate copies, and compares them by
relative error, ||out - ref|| / ||ref||, against a tolerance a few times what the
kernel tests accept. Any failure (a wrong result, a non-finite output, an
exception) stops the engine: `SelfCheckFailed` names the kernel, the shape, the
path and the error. The cases themselves are built in selfcheck_cases.py.
"""

from __future__ import annotations

import enum
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

log = logging.getLogger("nib.engine")

Inputs = dict[str, Any]
Outputs = torch.Tensor | tuple[torch.Tensor, ...]
# (kernel, inputs) -> the inputs the kernel under test gets; the reference keeps the
# originals. A test hook (EngineHooks.tamper_selfcheck): it must not modify `inputs`.
Tamper = Callable[[str, Inputs], Inputs]


class SelfCheckStatus(enum.Enum):
    NOT_RUN = "not_run"  # nothing to check (the CPU or reference path runs the references)
    PENDING = "pending"  # the engine is still starting
    PASSED = "passed"
    FAILED = "failed"


@dataclass(frozen=True)
class Case:
    kernel: str  # the kernel's name, e.g. "int4_linear", "decode_attention"
    shape: str  # e.g. "rows=1 out=1536 in=512"
    inputs: Callable[[], Inputs]  # fresh inputs (called twice: reference, kernel)
    run: Callable[[Inputs], Outputs]  # the kernel path the engine uses
    reference: Callable[[Inputs], Outputs]
    tolerance: float
    path: Callable[[], str] = lambda: ""  # which implementation ran (read after running)
    # Replaces the relative-error comparison: (kernel out, reference out) -> (error, why).
    compare: Callable[[Outputs, Outputs], tuple[float, str]] | None = None


@dataclass(frozen=True)
class KernelCheck:
    kernel: str
    shape: str
    path: str
    passed: bool
    error: float  # relative error (inf: non-finite output or an exception)
    tolerance: float
    message: str  # why it failed; "" when it passed
    ms: float

    def describe(self) -> str:
        where = f"{self.kernel} [{self.shape}]" + (f" via {self.path}" if self.path else "")
        if self.passed:
            return f"{where}: error {self.error:.2e} <= {self.tolerance:.1e}"
        return f"{where}: {self.message}"


@dataclass(frozen=True)
class SelfCheckReport:
    status: SelfCheckStatus
    note: str = ""
    checks: tuple[KernelCheck, ...] = ()
    seconds: float = 0.0

    @property
    def failures(self) -> tuple[KernelCheck, ...]:
        return tuple(c for c in self.checks if not c.passed)

    def headline(self) -> str:
        if self.status in (SelfCheckStatus.NOT_RUN, SelfCheckStatus.PENDING):
            return self.note
        n, bad = len(self.checks), len(self.failures)
        return f"{n - bad}/{n} kernel checks passed in {self.seconds:.1f}s"

    def summary(self) -> str:
        """The headline, and the first failures."""
        if self.status in (SelfCheckStatus.NOT_RUN, SelfCheckStatus.PENDING):
            return f"{self.status.value}: {self.note}" if self.note else self.status.value
        if not self.failures:
            return self.headline()
        return f"{self.headline()}; failed: {self.failed_list()}"

    def failed_list(self, most: int = 3) -> str:
        """The first failures, described (the health detail lists all of them)."""
        bad = self.failures
        text = "; ".join(c.describe() for c in bad[:most])
        return text + (f"; and {len(bad) - most} more" if len(bad) > most else "")


class SelfCheckFailed(RuntimeError):
    """A kernel disagreed with its reference at start-up: the engine refuses to serve."""

    def __init__(self, report: SelfCheckReport) -> None:
        self.report = report
        super().__init__("kernel self-check failed, refusing to serve: " + report.failed_list())


def _as_tuple(out: Outputs) -> tuple[torch.Tensor, ...]:
    return out if isinstance(out, tuple) else (out,)


def relative_error(out: Outputs, ref: Outputs) -> tuple[float, str]:
    """max over output tensors of ||out - ref|| / ||ref|| (inf, with the reason, when an
    output has the wrong shape or a NaN/inf the reference does not have)."""
    worst = 0.0
    for i, (o, r) in enumerate(zip(_as_tuple(out), _as_tuple(ref), strict=True)):
        if o.shape != r.shape:
            return math.inf, f"output {i} has shape {tuple(o.shape)}, expected {tuple(r.shape)}"
        o64, r64 = o.double(), r.double()
        if not torch.isfinite(o64[torch.isfinite(r64)]).all():
            return math.inf, f"output {i} has NaN/inf where the reference is finite"
        scale = float(r64.norm())
        err = float((o64 - r64).norm()) / (scale if scale > 0 else 1.0)
        worst = max(worst, err)
    return worst, ""


def run_case(case: Case, tamper: Tamper | None = None) -> KernelCheck:
    started = time.perf_counter()
    path = ""
    try:
        ref = case.reference(case.inputs())
        inputs = case.inputs()
        if tamper is not None:
            inputs = tamper(case.kernel, inputs)
        out = case.run(inputs)
        if out is not None and _as_tuple(out)[0].is_cuda:
            torch.cuda.synchronize()
        path = case.path()
        error, why = (case.compare or relative_error)(out, ref)
    except Exception as exc:  # a kernel that cannot run is as wrong as one that miscomputes
        error, why = math.inf, f"raised {type(exc).__name__}: {exc}"
    passed = error <= case.tolerance and not why
    if not passed and not why:
        why = f"relative error {error:.3g} > tolerance {case.tolerance:.1e}"
    ms = (time.perf_counter() - started) * 1e3
    return KernelCheck(case.kernel, case.shape, path, passed, error, case.tolerance, why, ms)


def run_self_check(cases: list[Case], tamper: Tamper | None = None) -> SelfCheckReport:
    """Run every case (all of them, so the report names every broken kernel)."""
    started = time.perf_counter()
    with torch.inference_mode():
        checks = tuple(run_case(case, tamper) for case in cases)
    seconds = time.perf_counter() - started
    status = SelfCheckStatus.PASSED if all(c.passed for c in checks) else SelfCheckStatus.FAILED
    report = SelfCheckReport(status, checks=checks, seconds=seconds)
    for check in report.failures:
        log.error("kernel self-check failed: %s", check.describe())
    return report
