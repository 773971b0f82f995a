"""The fused feed-forward kernel (engine/cuda/mlp16.cu) on the GPU against float64.

Every instantiation, bf16 and fp16, on the feed-forward shapes of Llama-2-7B and
Qwen2.5-Coder-1.5B and odd small ones (a hidden size that is not a multiple of the
down rows or of 256, a single chunk, an intermediate size that ends in a partial
chunk): fresh random inputs each run (the seed is in the failure message), against
mlp16.reference (gemv16.reference for its two kernels in turn). Each block runs three
times in a row on new inputs (the generation tags must tell launches apart), then
captured in a CUDA graph with other blocks and replayed.
"""

from __future__ import annotations

import random

import pytest
import torch

from nib.engine.cuda import mlp16

pytestmark = pytest.mark.gpu

DEVICE = torch.device("cuda")
SEED = random.randrange(1 << 30)
EPS_NORM = 1e-6

SHAPES = {  # (hidden K, intermediate F)
    "llama-2-7b": (4096, 11008),
    "qwen2.5-1.5b": (1536, 8960),
    "odd.rows": (1544, 1000),  # K % 4 = 2, K % 256 != 0, F ends in a partial chunk
    "odd.one-chunk": (256, 248),  # F < one chunk: no partials, the last split only
    "odd.tiny": (8, 8),
}
TOL = {torch.bfloat16: 2e-3, torch.float16: 5e-4}  # relative (Frobenius)
ULP = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}


@pytest.fixture(scope="module", autouse=True)
def _cuda_kernels() -> None:
    from nib.engine.cuda.loader import unavailable_reason

    why = unavailable_reason(DEVICE)
    if why:
        pytest.skip(f"nib's CUDA kernels are unavailable here: {why}")


def _gen(salt: int) -> torch.Generator:
    return torch.Generator(device=DEVICE).manual_seed(SEED + salt)


def _weights(k: int, f: int, dtype: torch.dtype, salt: int) -> dict[str, torch.Tensor]:
    g = _gen(salt)
    return {
        "wgu": (torch.randn(2 * f, k, generator=g, device=DEVICE) * k**-0.5).to(dtype),
        "wd": (torch.randn(k, f, generator=g, device=DEVICE) * f**-0.5).to(dtype),
        "nw": (1 + 0.1 * torch.randn(k, generator=g, device=DEVICE)).to(dtype),
    }


def _h(k: int, dtype: torch.dtype, salt: int) -> torch.Tensor:
    return (torch.randn(k, generator=_gen(salt), device=DEVICE) * 3.0).to(dtype)


def check(out: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    """As test_cuda_gemv16.check: a correct kernel differs from the reference only by
    one unit where its fp32 sums land across a rounding midpoint."""
    assert not out.isnan().any(), f"{what}: NaN in the output (seed {SEED})"
    o, r = out.double().reshape(-1), ref.double().reshape(-1)
    rel = float((o - r).norm() / r.norm())
    worst = float((o - r).abs().max())
    bound = 2 * ULP[ref.dtype] * float(r.abs().max())
    assert rel <= TOL[ref.dtype] and worst <= bound, (
        f"{what}: relative error {rel:.2e}, worst {worst:.3g} > {bound:.3g} (seed {SEED})"
    )


def _product_check(h_new: torch.Tensor, h_old: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    """The whole row, then the product alone (h_new - h_old against ref - h_old) element
    by element: within two units of h's and of the product's rounding, so that a row
    or a chunk left out cannot hide behind a large residual."""
    check(h_new, ref, what)
    got, want = h_new.double() - h_old.double(), ref.double() - h_old.double()
    allowed = 2 * ULP[ref.dtype] * (ref.double().abs() + want.abs()) + 1e-6
    bad = (got - want).abs() > allowed
    assert not bad.any(), (
        f"{what}: {int(bad.sum())} of {bad.numel()} products off, first at "
        f"{int(bad.nonzero()[0])} (seed {SEED})"
    )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", SHAPES)
def test_every_config_matches_the_reference(shape: str, dtype: torch.dtype) -> None:
    k, f = SHAPES[shape]
    w = _weights(k, f, dtype, salt=k + f)
    configs = mlp16.candidates(w["wgu"], w["wd"])
    assert configs, f"no mlp16 config takes {shape}"
    for i, cfg in enumerate(configs):
        block = mlp16.Mlp16(w["wgu"], w["wd"], cfg)
        for rep in range(3):  # the same buffers, three generations
            h0 = _h(k, dtype, salt=100 * i + rep)
            h = h0.clone()
            block.run(h, w["nw"], EPS_NORM)
            ref = mlp16.reference(h0, w["nw"], EPS_NORM, w["wgu"], w["wd"])
            torch.cuda.synchronize()
            _product_check(h, h0, ref, f"{shape} {dtype} {cfg.label()} launch {rep}")
        assert block.gave_up() == 0, f"{shape} {cfg.label()}: a wait gave up"
        assert int(block.sync[1]) == 0, "the exit counter must be back at zero"
        assert int(block.sync[0]) == 3, "one generation per launch"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_graph_of_blocks_replays(dtype: torch.dtype) -> None:
    """Three blocks chained on one residual stream, captured once and replayed on new
    inputs: each replay equals the reference chain."""
    k, f = 1536, 8960
    layers = [_weights(k, f, dtype, salt=900 + i) for i in range(3)]
    cfgs = mlp16.candidates(layers[0]["wgu"], layers[0]["wd"])
    blocks = [mlp16.Mlp16(w["wgu"], w["wd"], cfgs[i % len(cfgs)]) for i, w in enumerate(layers)]
    h = _h(k, dtype, salt=1)

    def chain() -> None:
        for b, w in zip(blocks, layers, strict=True):
            b.run(h, w["nw"], EPS_NORM)

    chain()  # warm-up outside the capture
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        chain()
    for rep in range(3):
        h0 = _h(k, dtype, salt=10 + rep)
        h.copy_(h0)
        graph.replay()
        ref = h0
        for w in layers:
            ref = mlp16.reference(ref, w["nw"], EPS_NORM, w["wgu"], w["wd"])
        torch.cuda.synchronize()
        check(h, ref, f"graph replay {rep} {dtype}")
    assert all(b.gave_up() == 0 for b in blocks)


def test_bad_inputs_are_refused_with_the_rule() -> None:
    w = _weights(512, 1024, torch.bfloat16, salt=3)
    cfg = mlp16.CONFIGS[0]
    with pytest.raises(ValueError, match="not \\[2F, K\\] and \\[K, F\\]"):
        mlp16.Mlp16(w["wgu"], w["wd"][:, :512].contiguous(), cfg)
    with pytest.raises(ValueError, match="dtype"):
        mlp16.Mlp16(w["wgu"], w["wd"].half(), cfg)
    block = mlp16.Mlp16(w["wgu"], w["wd"], cfg)
    with pytest.raises(ValueError, match="one contiguous, 16-byte aligned row of 512"):
        block.run(torch.zeros(511, dtype=torch.bfloat16, device=DEVICE), w["nw"], EPS_NORM)
    misaligned = torch.zeros(513, dtype=torch.bfloat16, device=DEVICE)[1:]
    with pytest.raises(ValueError, match="aligned"):
        block.run(misaligned, w["nw"], EPS_NORM)
