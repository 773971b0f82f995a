"""The batch-1 INT4 GEMV with fused glue (engine/quant/fused_gemv.py), in Triton's
interpreter on the CPU: indexing, masking, split-K, the norm pre-pass and the
epilogues against an fp32 reference of the unfused sequence. The inline-PTX
dequantisation cannot run here; tests/gpu runs the same checks with it."""

from __future__ import annotations

import importlib
import os
import sys

import pytest
import torch
import torch.nn.functional as F

os.environ["TRITON_INTERPRET"] = "1"
for _mod in [m for m in sys.modules if m.startswith("nib.engine.quant.")]:
    if "triton" in _mod or _mod.endswith("fused_gemv"):
        importlib.reload(sys.modules[_mod])  # a kernel compiled before the flag was set

from nib.engine.quant import fused_gemv as fg  # noqa: E402
from nib.engine.quant.layout import pack  # noqa: E402
from nib.engine.quant.reference import dequantize_packed  # noqa: E402
from nib.engine.quant.rtn import rtn_quantize  # noqa: E402

CONFIGS = [
    fg.Int4GemvConfig(8, 2, 4),
    fg.Int4GemvConfig(16, 1, 4, 3),
    fg.Int4GemvConfig(4, 4, 2, 2),
    fg.Int4GemvConfig(8, 2, 4, prenorm=True),  # the norm as its own kernel first
]
EPS = 1e-6


def _weights(n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    q = rtn_quantize(torch.randn(n, k, generator=g))
    return pack(q.codes), q.scales


def _normed(h: torch.Tensor, nw: torch.Tensor) -> torch.Tensor:
    """The unfused path's rounding: normalise in fp32, round, times the weight, round."""
    hf = h.float()
    n = (hf * torch.rsqrt(hf.pow(2).mean() + EPS)).to(h.dtype)
    return (nw * n).to(torch.float16).float()


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref).norm() / ref.norm())


@pytest.mark.parametrize("cfg", CONFIGS, ids=[c.label() for c in CONFIGS])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("fusion", ["", "norm", "norm_glu", "residual"])
def test_fused_int4_gemv_matches_the_unfused_sequence(
    cfg: fg.Int4GemvConfig, dtype: torch.dtype, fusion: str
) -> None:
    n, k = 40, 640  # 5 groups (steps past K are masked) and rows past N (masked)
    qweight, scales = _weights(2 * n if fusion == "norm_glu" else n, k, seed=len(fusion) + k)
    w = dequantize_packed(qweight, scales)
    g = torch.Generator().manual_seed(7)
    x = (torch.randn(1, 1, k, generator=g) * 3).to(dtype)
    nw = (torch.randn(k, generator=g) * 0.1 + 1).to(dtype)
    bias = None if fusion == "norm_glu" else torch.randn(n, generator=g).to(dtype)
    b = 0 if bias is None else bias.float()
    if fusion == "residual":
        residual = torch.randn(n, generator=g).to(dtype)
        out = residual.clone()
        fg.gemv_residual(x, qweight, scales, bias, out, cfg, use_asm=False)
        ref = residual.float() + (x.view(-1).half().float() @ w.t() + b)
    elif fusion:
        glu = fusion == "norm_glu"
        out = fg.norm_gemv(x, nw, EPS, qweight, scales, bias, cfg, glu, use_asm=False)
        ref = _normed(x.view(-1), nw) @ w.t() + b
        if glu:
            gate, up = (r.to(dtype).float() for r in ref.chunk(2))  # the kernel rounds both
            ref = F.silu(gate).to(dtype).float() * up
    else:
        out = fg.gemv(x, qweight, scales, bias, cfg, use_asm=False)
        ref = x.view(-1).half().float() @ w.t() + b
    assert out.dtype == dtype and out.numel() == n
    assert not out.isnan().any()
    # The result is rounded to dtype; the interpreter truncates fp32 -> bf16 instead of
    # rounding (a bias that the GLU's three roundings compound), hence bf16's looser bound.
    tol = 2e-3 if dtype == torch.float16 else 3e-2
    assert _rel(out.view(-1), ref) <= tol


def test_every_output_is_written_and_split_k_counters_reset() -> None:
    n, k = 24, 512
    qweight, scales = _weights(n, k, seed=3)
    x = torch.randn(k, generator=torch.Generator().manual_seed(1)).half()
    cfg = fg.Int4GemvConfig(8, 1, 4, 4)
    buffers = fg.split_buffers(n, cfg, torch.device("cpu"))
    out = torch.full((n,), float("nan"), dtype=torch.float16)  # poisoned
    fg.launch(x, qweight, scales, None, out, n, cfg, buffers=buffers, use_asm=False)
    assert not out.isnan().any()
    assert buffers is not None and not buffers[1].any()  # the last program reset them
    again = torch.empty_like(out)
    fg.launch(x, qweight, scales, None, again, n, cfg, buffers=buffers, use_asm=False)
    assert torch.equal(again, out)
    ref = x.float() @ dequantize_packed(qweight, scales).t()
    assert _rel(out, ref) <= 2e-3


def test_bad_input_is_refused() -> None:
    qweight, scales = _weights(16, 256, seed=5)
    with pytest.raises(ValueError, match="one contiguous row of 256"):
        fg.gemv(torch.zeros(2, 256).half(), qweight, scales, None, fg.DEFAULT, use_asm=False)
