"""INT4 kernels on the GPU vs an fp32 reference of the dequantised weights.

Every path (GEMV, tensor-core, dequant + cuBLAS; inline-PTX and pure-Triton
dequantisation) over the Llama-2-7B and Qwen2.5-Coder-1.5B layer shapes and
M in {1, 2, 4, 8, 16, 64, 512}: fresh random inputs each run, output poisoned
with NaN before the call and checked fully written, relative error (Frobenius)
at most 1e-3 and no element off by more than 1% of the largest output.
"""

from __future__ import annotations

import pytest
import torch

from nib.engine.quant import kernels
from nib.engine.quant.format import Int4Weight
from nib.engine.quant.layout import pack
from nib.engine.quant.reference import dequantize_packed

pytestmark = pytest.mark.gpu

SHAPES = {  # (in K, out N)
    "llama-2-7b.qkv": (4096, 12288),
    "llama-2-7b.o_proj": (4096, 4096),
    "llama-2-7b.gate_up": (4096, 22016),
    "llama-2-7b.down": (11008, 4096),
    "llama-2-7b.lm_head": (4096, 32000),
    "qwen2.5-1.5b.qkv": (1536, 2048),
    "qwen2.5-1.5b.o_proj": (1536, 1536),
    "qwen2.5-1.5b.gate_up": (1536, 17920),
    "qwen2.5-1.5b.down": (8960, 1536),
    "qwen2.5-1.5b.lm_head": (1536, 151936),
    "odd.small": (384, 200),  # N not a multiple of any block size
}
MS = (1, 2, 4, 8, 16, 64, 512)
_WEIGHTS: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}


def weights(layer: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random codes and scales (cached per shape) and the fp32 dequantised weight."""
    if layer not in _WEIGHTS:
        _WEIGHTS.clear()  # keep one shape's fp32 reference at a time
        k, n = SHAPES[layer]
        g = torch.Generator(device="cuda").manual_seed(n + k)
        codes = torch.randint(0, 16, (n, k), generator=g, device="cuda", dtype=torch.uint8)
        scales = (torch.rand(k // 128, n, generator=g, device="cuda") * 0.02 + 0.001).half()
        w = Int4Weight(codes, scales)
        qweight = pack(w.codes)
        _WEIGHTS[layer] = (qweight, scales, dequantize_packed(qweight, scales))
    return _WEIGHTS[layer]


def check(layer: str, m: int, config: kernels.KernelConfig, bias: bool = False) -> None:
    qweight, scales, w32 = weights(layer)
    n, k = w32.shape
    x = torch.randn(m, k, device="cuda").half()
    b = torch.randn(n, device="cuda").half() if bias else None
    ref = x.float() @ w32.t()
    if b is not None:
        ref += b.float()
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
    kernels.run(x, qweight, scales, b, config, out=out)
    torch.cuda.synchronize()
    assert not out.isnan().any(), f"{config.label()}: output not fully written"
    err = out.float() - ref
    rel = float(err.norm() / ref.norm())
    worst = float(err.abs().max() / ref.abs().max())
    assert rel <= 1e-3 and worst <= 1e-2, f"{layer} m={m} {config.label()}: {rel:.2e} {worst:.2e}"


def _configs_for(m: int) -> list[kernels.KernelConfig]:
    base = [c for c in kernels.candidates(m) if c.path != "gemv" or m <= c.block_m]
    tl_twins = [
        kernels.KernelConfig(**{**c.__dict__, "asm": False}) for c in base if c.path != "dequant"
    ]
    return list(dict.fromkeys(base + tl_twins))


@pytest.mark.parametrize("m", MS)
@pytest.mark.parametrize("layer", SHAPES)
def test_chosen_path_matches_reference(layer: str, m: int) -> None:
    k, n = SHAPES[layer]
    check(layer, m, kernels.choose(m, n, k))


@pytest.mark.parametrize("m", (1, 4, 16, 64))
@pytest.mark.parametrize("layer", ["llama-2-7b.down", "qwen2.5-1.5b.o_proj", "odd.small"])
def test_every_candidate_config_matches_reference(layer: str, m: int) -> None:
    for config in _configs_for(m):
        check(layer, m, config, bias=True)


def test_split_k_counters_reset_between_calls() -> None:
    config = kernels.KernelConfig("gemv", 1, 4, 2, 4, 4, 2, True)
    for _ in range(3):
        check("llama-2-7b.down", 1, config)
