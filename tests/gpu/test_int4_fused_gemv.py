"""The batch-1 INT4 GEMV with fused glue (quant/fused_gemv.py) on the GPU, inline PTX.

Every candidate tile and every fusion over the Llama-2-7B and Qwen2.5-Coder-1.5B
layer shapes, against an fp32 reference of the unfused sequence on the
dequantised weights: fresh random inputs, outputs poisoned with NaN and checked
fully written, relative error at most 1e-3 (2e-3 where the result is rounded
through a 16-bit GLU) and no element off by more than 1% of the largest.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from nib.engine.quant import fused_gemv as fg
from tests.gpu.test_int4_kernels import SHAPES, weights

pytestmark = pytest.mark.gpu
EPS = 1e-6
FUSION_OF = {"qkv": "norm", "o_proj": "residual", "gate_up": "norm_glu", "down": "residual"}


def _check(layer: str, cfg: fg.Int4GemvConfig, fusion: str, dtype: torch.dtype) -> None:
    qweight, scales, w32 = weights(layer)
    n_all, k = w32.shape
    glu = fusion == "norm_glu"
    n = n_all // 2 if glu else n_all
    x = (torch.randn(k, device="cuda") * 3).to(dtype)
    nw = (torch.randn(k, device="cuda") * 0.1 + 1).to(dtype)
    bias = None if glu else torch.randn(n, device="cuda").to(dtype)
    b = 0 if bias is None else bias.float()
    if fusion == "residual":
        residual = torch.randn(n, device="cuda").to(dtype)
        out = residual.clone()
        fg.gemv_residual(x, qweight, scales, bias, out, cfg)
        ref = residual.float() + (x.half().float() @ w32.t() + b)
    elif fusion:
        out = torch.full((n,), float("nan"), device="cuda", dtype=dtype)
        out.copy_(fg.norm_gemv(x, nw, EPS, qweight, scales, bias, cfg, glu).view(-1))
        hf = x.float()
        xn = (nw * (hf * torch.rsqrt(hf.pow(2).mean() + EPS)).to(dtype)).half().float()
        ref = xn @ w32.t() + b
        if glu:
            gate, up = (r.to(dtype).float() for r in ref.chunk(2))
            ref = F.silu(gate).to(dtype).float() * up
    else:
        out = torch.full((n,), float("nan"), device="cuda", dtype=dtype)
        fg.launch(x, qweight, scales, bias, out, n, cfg)
        ref = x.half().float() @ w32.t() + b
    torch.cuda.synchronize()
    assert not out.isnan().any(), f"{layer} {cfg.label()} {fusion}: output not fully written"
    err = out.float() - ref
    rel = float(err.norm() / ref.norm())
    worst = float(err.abs().max() / ref.abs().max())
    # The output is rounded to 16 bits (bf16: 2^-9 relative); the GLU rounds three times,
    # and where a bf16 rounding of gate or up flips, the product moves by up to two ulps.
    bound = (1e-3 if dtype == torch.float16 else 4e-3) * (2 if glu else 1)
    worst_bound = 2.5e-2 if glu and dtype == torch.bfloat16 else 1e-2
    assert rel <= bound and worst <= worst_bound, (
        f"{layer} {cfg.label()} {fusion}: {rel:.2e} {worst:.2e}"
    )


def _fusion(layer: str) -> str:
    return FUSION_OF.get(layer.split(".")[-1], "norm")


@pytest.mark.parametrize("layer", ["llama-2-7b.down", "qwen2.5-1.5b.gate_up", "qwen2.5-1.5b.qkv"])
def test_every_candidate_matches_the_reference(layer: str) -> None:
    """Every tile start-up may choose (each compiles per K and variant: three shapes)."""
    fusion = _fusion(layer)
    for cfg in fg.CANDIDATES:
        _check(layer, cfg, "", torch.float16)
        _check(layer, cfg, fusion, torch.float16)
        if fusion.startswith("norm"):
            _check(layer, replace(cfg, prenorm=True), fusion, torch.float16)


@pytest.mark.parametrize("layer", [name for name in SHAPES if not name.startswith("odd")])
def test_every_layer_shape_matches_the_reference(layer: str) -> None:
    for cfg in (fg.DEFAULT, fg.Int4GemvConfig(8, 4, 4, 4)):
        _check(layer, cfg, "", torch.float16)
        _check(layer, cfg, _fusion(layer), torch.float16)


@pytest.mark.parametrize("fusion", ["", "norm", "norm_glu", "residual"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_odd_shapes_and_bf16_inputs(fusion: str, dtype: torch.dtype) -> None:
    for cfg in (fg.DEFAULT, fg.Int4GemvConfig(8, 4, 4, 4)):
        _check("odd.small", cfg, fusion, dtype)
        _check("qwen2.5-1.5b.down", cfg, fusion, dtype)


def test_split_k_counters_reset_between_calls_and_in_a_graph() -> None:
    qweight, scales, w32 = weights("llama-2-7b.down")
    cfg = fg.Int4GemvConfig(8, 4, 4, 4)
    n, k = w32.shape
    buffers = fg.split_buffers(n, cfg, torch.device("cuda"))
    x = torch.randn(k, device="cuda").half()
    out = torch.empty(n, device="cuda", dtype=torch.float16)
    fg.launch(x, qweight, scales, None, out, n, cfg, buffers=buffers)  # warm up / compile
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fg.launch(x, qweight, scales, None, out, n, cfg, buffers=buffers)
    for _ in range(3):
        x.copy_(torch.randn(k, device="cuda"))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref = x.float() @ w32.t()
        assert not out.isnan().any()
        assert float((out.float() - ref).norm() / ref.norm()) <= 1e-3
    assert buffers is not None and not buffers[1].any()


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@torch.inference_mode()  # as the engine runs (the general kernels write with out=)
def test_model_with_fused_int4_gemv_matches_the_general_kernels(
    arch: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A whole decode step, batch-1 GEMV with every fusion on, against the same INT4
    model on the general kernels and the unfused glue (logits and greedy tokens)."""
    from nib.engine.loader import load_model
    from nib.engine.ops import TorchOps, TritonOps
    from nib.engine.quant.fused_gemv import swap_in_int4_gemv
    from nib.engine.quant.linear import Int4Linear

    from .models import save_random_hf_model

    model_dir = save_random_hf_model(arch, tmp_path_factory.mktemp(arch))
    model = load_model(model_dir, quant="int4", device="cuda", dtype=torch.float16)
    model.setup_cache(256)
    prompt = torch.randint(0, model.cfg.vocab_size, (1, 40), device="cuda")

    def greedy(steps: int, forced: list[int] | None = None) -> tuple[torch.Tensor, list[int]]:
        """Greedy picks of `steps` decode steps; fed `forced` tokens if given (so both
        paths see the same inputs), and the first decode step's logits."""
        logits = model(prompt, torch.arange(40, device="cuda"), 40, last_only=True)
        first, tokens = logits.float(), []
        for t in range(steps):
            tokens.append(int(logits[0, -1].argmax()))
            tok = tokens[-1] if forced is None else forced[t]
            pos = torch.tensor([40 + t], device="cuda")
            logits = model(torch.tensor([[tok]], device="cuda"), pos, 41 + t)
            if t == 0:
                first = logits.float()
        return first, tokens

    model.ops = TritonOps()
    labels = swap_in_int4_gemv(model, tune=False)
    assert all(v.startswith("int4 gemv1 ") for v in labels.values()), labels
    fused_logits, fused_tokens = greedy(16)
    for m in model.modules():
        if isinstance(m, Int4Linear):
            m.use_gemv(None)
    model.ops = TorchOps()
    ref_logits, ref_tokens = greedy(16, forced=fused_tokens)
    rel = float((fused_logits - ref_logits).norm() / ref_logits.norm())
    assert rel <= 1e-2, rel
    agree = sum(a == b for a, b in zip(fused_tokens, ref_tokens, strict=True))
    assert agree >= 14, (fused_tokens, ref_tokens)  # fp16 near-ties may flip a pick
