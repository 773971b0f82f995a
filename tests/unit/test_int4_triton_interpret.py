"""The Triton INT4 kernels, run by the Triton interpreter on the CPU (small shapes).

This checks the kernels' indexing, masking, split-K reduction and the pure-Triton
dequantisation (the layout and the 1024.0-trick constants) against the CPU
reference. The inline-PTX variant cannot run here; tests/gpu covers it.
"""

from __future__ import annotations

import importlib
import os
import sys

import pytest
import torch

os.environ["TRITON_INTERPRET"] = "1"
for _mod in [m for m in sys.modules if m.startswith("nib.engine.quant.triton_")]:
    importlib.reload(sys.modules[_mod])  # a kernel compiled before the flag was set

from nib.engine.quant import kernels  # noqa: E402
from nib.engine.quant.layout import pack  # noqa: E402
from nib.engine.quant.reference import dequantize_packed  # noqa: E402
from nib.engine.quant.rtn import rtn_quantize  # noqa: E402

CONFIGS = [
    kernels.KernelConfig("gemv", 1, 8, 2, 1, asm=False),
    kernels.KernelConfig("gemv", 4, 16, 1, 3, asm=False),
    kernels.KernelConfig("mma", 16, 32, 1, 1, asm=False),
    kernels.KernelConfig("mma", 16, 16, 1, 2, asm=False),
    kernels.KernelConfig("dequant", asm=False),
]


SHAPES = [(1, 48, 384), (3, 64, 256), (17, 40, 256)]
CASES = [
    (c, *shape)
    for c in CONFIGS
    for shape in SHAPES
    if c.path != "gemv" or shape[0] <= c.block_m  # a gemv config covers M <= block_m
]


@pytest.mark.parametrize(
    ("config", "m", "n", "k"), CASES, ids=[f"{c.label()}-{m}x{n}x{k}" for c, m, n, k in CASES]
)
def test_kernel_matches_fp32_reference_in_the_interpreter(
    config: kernels.KernelConfig, m: int, n: int, k: int
) -> None:
    g = torch.Generator().manual_seed(m * 1000 + n)
    q = rtn_quantize(torch.randn(n, k, generator=g))
    qweight = pack(q.codes)
    x = torch.randn(m, k, generator=g).half()
    bias = torch.randn(n, generator=g).half()
    ref = x.float() @ dequantize_packed(qweight, q.scales).t() + bias.float()
    out = torch.full((m, n), float("nan"), dtype=torch.float16)  # poisoned: must be overwritten
    kernels.run(x, qweight, q.scales, bias, config, out=out)
    assert not out.isnan().any()
    rel = float((out.float() - ref).norm() / ref.norm())
    assert rel <= 1e-3, f"{config.label()}: relative error {rel:.2e}"
    # A second call with the same workspace (split-K counters must have been reset).
    out2 = kernels.run(x, qweight, q.scales, bias, config)
    assert torch.equal(out2, out)
