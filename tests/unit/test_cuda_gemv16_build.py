"""gemv16.cu compiles for sm_90 and sm_80 with no spills and no stack (no GPU needed).

A GEMV that spills its load buffers to local memory streams them twice and
loses the bandwidth it exists for; ptxas says so at build time. Also checks
that the kernels the wrapper may name are exactly the ones the .cu defines.
Skipped where nvcc is absent.
"""

from __future__ import annotations

import re

import pytest

from nib.engine.cuda import build
from nib.engine.cuda.gemv16 import GLU, PLAIN, Gemv16Config, kernel_name
from tests.unit.cuda_tools import nvcc_or_skip

torch = pytest.importorskip("torch")


def _expected_kernels() -> set[str]:
    names = set()
    for glu, table in ((False, PLAIN), (True, GLU)):
        for r, w, u in table:
            for dtype in (torch.bfloat16, torch.float16):
                names.add(kernel_name(Gemv16Config(r, w, u), dtype, glu))
    return names


def test_the_source_instantiates_exactly_the_python_tables() -> None:
    source = (build.HERE / "gemv16.cu").read_text()
    plain = {
        tuple(map(int, m)) for m in re.findall(r"^G16_PLAIN\((\d+), (\d+), (\d+)\)", source, re.M)
    }
    glu = {tuple(map(int, m)) for m in re.findall(r"^G16_GLU\((\d+), (\d+), (\d+)\)", source, re.M)}
    assert plain == PLAIN
    assert glu == GLU
    assert GLU <= PLAIN  # a gate_up layer's GLU config also runs its plain product


@pytest.mark.slow
@pytest.mark.parametrize("target", ["sm_90", "sm_80"])
def test_every_kernel_compiles_without_spills_or_stack(target: str) -> None:
    nvcc_or_skip()
    report = build.resources("gemv16.cu", target)
    assert {r.kernel for r in report} == _expected_kernels()
    for r in report:
        assert r.spill_stores == 0 and r.spill_loads == 0, r
        assert r.stack_bytes == 0, r
        assert r.registers <= 128, r  # at least 16 warps per SM resident
