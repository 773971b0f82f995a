"""The Triton kernels against their PyTorch references, on fresh random inputs.

On a machine without a GPU these run in Triton's interpreter (tests/conftest.py
sets TRITON_INTERPRET=1); tests/gpu runs the same comparisons compiled.
"""

from __future__ import annotations

import os

import pytest
import torch

triton = pytest.importorskip("triton")

from nib.engine.kernels import reference as ref  # noqa: E402
from nib.engine.kernels.activation import silu_mul  # noqa: E402
from nib.engine.kernels.decode_attention import DecodeAttention  # noqa: E402
from nib.engine.kernels.gemv import CANDIDATES, gemv, gemv_residual, norm_gemv  # noqa: E402
from nib.engine.kernels.norm import add_rms_norm, rms_norm  # noqa: E402
from nib.engine.kernels.rope_cache import rope_cache  # noqa: E402
from nib.engine.kernels.sampling import exp_noise  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def rel_err(out: torch.Tensor, expected: torch.Tensor) -> float:
    assert torch.isfinite(out).all(), "output has NaN/inf (unwritten or broken)"
    return float((out.float() - expected.float()).norm() / expected.float().norm())


def poisoned(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=dtype, device=DEVICE)


def tol(dtype: torch.dtype) -> float:
    return {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,cols", [(1, 128), (5, 384), (3, 1000)])
def test_rms_norm_and_fused_residual(dtype: torch.dtype, rows: int, cols: int) -> None:
    x = torch.randn(rows, cols, dtype=dtype, device=DEVICE)
    res = torch.randn(rows, cols, dtype=dtype, device=DEVICE)
    w = (1 + 0.1 * torch.randn(cols, device=DEVICE)).to(dtype)
    assert rel_err(rms_norm(x, w, 1e-6), ref.rms_norm_ref(x, w, 1e-6)) < tol(dtype)
    expected_res = res + x
    r = res.clone()
    out = add_rms_norm(x, r, w, 1e-6)
    assert rel_err(r, expected_res) < tol(dtype)
    assert rel_err(out, ref.rms_norm_ref(expected_res, w, 1e-6)) < tol(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_mul(dtype: torch.dtype) -> None:
    gu = torch.randn(3, 2 * 1100, dtype=dtype, device=DEVICE)
    assert rel_err(silu_mul(gu), ref.silu_mul_ref(gu)) < tol(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,kv_heads,dim,t", [(4, 2, 64, 1), (6, 1, 64, 7), (2, 2, 128, 3)])
def test_rope_and_cache_write(
    dtype: torch.dtype, heads: int, kv_heads: int, dim: int, t: int
) -> None:
    s = 32
    qkv = torch.randn(1, t, (heads + 2 * kv_heads) * dim, dtype=dtype, device=DEVICE)
    positions = torch.randperm(s, device=DEVICE)[:t]
    angles = torch.rand(s, dim, device=DEVICE) * 6
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    kc, vc = poisoned((1, kv_heads, s, dim), dtype), poisoned((1, kv_heads, s, dim), dtype)
    kr, vr = kc.clone(), vc.clone()
    q = rope_cache(qkv, positions, cos, sin, kc, vc, heads, kv_heads)
    q_ref = ref.rope_cache_ref(qkv, positions, cos, sin, kr, vr, heads, kv_heads)
    assert rel_err(q, q_ref) < tol(dtype)
    assert rel_err(kc[:, :, positions], kr[:, :, positions]) < tol(dtype)
    assert torch.equal(vc[:, :, positions], vr[:, :, positions])
    untouched = torch.ones(s, dtype=torch.bool, device=DEVICE)
    untouched[positions] = False
    assert torch.isnan(kc[:, :, untouched]).all(), "wrote outside the given positions"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize(
    "heads,kv_heads,dim,length",
    [(4, 2, 64, 1), (6, 1, 64, 200), (2, 2, 128, 64), (12, 2, 128, 257)],
)
def test_decode_attention_reads_only_the_filled_cache(
    dtype: torch.dtype, heads: int, kv_heads: int, dim: int, length: int
) -> None:
    s = 320
    q = torch.randn(1, heads, 1, dim, dtype=dtype, device=DEVICE)
    k = torch.randn(1, kv_heads, s, dim, dtype=dtype, device=DEVICE)
    v = torch.randn(1, kv_heads, s, dim, dtype=dtype, device=DEVICE)
    k[:, :, length:] = float("nan")  # past the filled length: must never be read
    v[:, :, length:] = float("nan")
    attn = DecodeAttention(heads, kv_heads, dim, s, DEVICE)
    out = attn(q, k, v, torch.tensor([length - 1], device=DEVICE))
    assert rel_err(out, ref.decode_attention_ref(q, k, v, length)) < tol(dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_multi_query_attention_is_causal_per_query(dtype: torch.dtype) -> None:
    """T new tokens after a cached prefix: query t sees [0, start + t] (a chunk prefill
    or a speculative verify step); equals running each query as its own decode step."""
    heads, kv_heads, dim, s, start, t = 6, 2, 64, 256, 37, 9
    k = torch.randn(1, kv_heads, s, dim, dtype=dtype, device=DEVICE)
    v = torch.randn(1, kv_heads, s, dim, dtype=dtype, device=DEVICE)
    k[:, :, start + t :] = float("nan")
    v[:, :, start + t :] = float("nan")
    q = torch.randn(1, heads, t, dim, dtype=dtype, device=DEVICE)
    attn = DecodeAttention(heads, kv_heads, dim, s, DEVICE, max_queries=16)
    positions = torch.arange(start, start + t, device=DEVICE)
    out = attn(q, k, v, positions)
    for i in range(t):
        expected = ref.decode_attention_ref(q[:, :, i : i + 1], k, v, start + i + 1)
        assert rel_err(out[:, :, i : i + 1], expected) < tol(dtype)


@pytest.fixture(
    params=[False, True] if DEVICE.type == "cuda" else [False],
    ids=lambda on: "pdl" if on else "plain",
)
def triton_pdl(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """The Triton GEMV launched plainly and, on a GPU that has it, with programmatic
    dependent launch (its first weight tile loaded before griddepcontrol.wait)."""
    from nib.engine.kernels import gemv as gemv_module

    on = bool(request.param)
    if DEVICE.type == "cuda":
        if on and not gemv_module.pdl_launch(DEVICE)["PDL"]:
            pytest.skip("no programmatic dependent launch on this GPU or Triton")
        monkeypatch.setitem(gemv_module._PDL, torch.cuda.current_device(), on)
    return on


@pytest.mark.skipif(DEVICE.type != "cuda", reason="needs CUDA")
def test_triton_gemv_launches_with_pdl_where_the_cuda_kernels_do() -> None:
    from triton.backends.nvidia.compiler import CUDAOptions

    from nib.engine.cuda.loader import pdl
    from nib.engine.kernels.gemv import pdl_launch

    expected = pdl(DEVICE) and "launch_pdl" in CUDAOptions.__dataclass_fields__
    assert pdl_launch(DEVICE)["PDL"] is expected
    if torch.cuda.get_device_capability() >= (9, 0):
        assert expected, "sm_90 with a Triton that has launch_pdl: the GEMV must use PDL"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,k", [(100, 256), (384, 640), (7, 1024)])
@pytest.mark.parametrize("bias", [False, True])
def test_gemv(dtype: torch.dtype, n: int, k: int, bias: bool, triton_pdl: bool) -> None:
    w = torch.randn(n, k, dtype=dtype, device=DEVICE) / k**0.5
    x = torch.randn(1, 1, k, dtype=dtype, device=DEVICE)
    b = torch.randn(n, dtype=dtype, device=DEVICE) if bias else None
    expected = torch.nn.functional.linear(x.double(), w.double(), None if b is None else b.double())
    for cfg in (*CANDIDATES[:3], CANDIDATES[-1]):  # the last splits K
        assert rel_err(gemv(x, w, b, cfg), expected) < tol(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,k", [(100, 256), (7, 1024)])
def test_fused_gemv_prologue_and_epilogues(
    dtype: torch.dtype, n: int, k: int, triton_pdl: bool
) -> None:
    """The batch-1 fusions against the unfused reference sequence: norm -> linear,
    norm -> gate_up -> SiLU·mul, linear -> residual add (in place, every row written)."""
    w = torch.randn(2 * n, k, dtype=dtype, device=DEVICE) / k**0.5
    b = torch.randn(2 * n, dtype=dtype, device=DEVICE)
    h = 3 * torch.randn(1, 1, k, dtype=dtype, device=DEVICE)
    nw = (1 + 0.1 * torch.randn(k, device=DEVICE)).to(dtype)
    normed = ref.rms_norm_ref(h, nw, 1e-6)
    split = next(c for c in CANDIDATES if c.split_k > 1)
    for cfg in (CANDIDATES[0], split):
        got = norm_gemv(h, nw, 1e-6, w, b, cfg)
        expected = torch.nn.functional.linear(normed.double(), w.double(), b.double())
        assert got.shape == (1, 1, 2 * n) and rel_err(got, expected) < tol(dtype)
        glu = norm_gemv(h, nw, 1e-6, w, None, cfg, glu=True)
        gate_up = torch.nn.functional.linear(normed.double(), w.double())
        # Against float64 the kernel rounds four times in a row (gate, up, SiLU, product),
        # each by up to half an ulp, so 16-bit types get twice the one-rounding tolerance;
        # Triton's interpreter truncates fp32 -> bf16 instead (the GPU rounds to nearest)
        # and drifts ~1% more.
        glu_tol = tol(dtype) * (1 if dtype is torch.float32 else 2)
        if dtype is torch.bfloat16 and INTERPRETED:
            glu_tol = 5e-2
        assert glu.shape == (1, 1, n) and rel_err(glu, ref.silu_mul_ref(gate_up)) < glu_tol
        residual = torch.randn(1, 1, 2 * n, dtype=dtype, device=DEVICE)
        before = residual.clone()
        gemv_residual(h, w, b, residual, cfg)
        expected = before.double() + torch.nn.functional.linear(h.double(), w.double(), b.double())
        assert rel_err(residual, expected) < tol(dtype)
    with pytest.raises(ValueError, match="GLU"):
        norm_gemv(h, nw, 1e-6, w, b, CANDIDATES[0], glu=True)


def test_exp_noise_is_seeded_and_exponential() -> None:
    out = torch.empty(20000, device=DEVICE)
    seed, step = torch.tensor([7], device=DEVICE), torch.tensor([3], device=DEVICE)
    a = exp_noise(out.clone(), seed, step)
    b = exp_noise(out.clone(), seed, step)
    c = exp_noise(out.clone(), seed, step + 1)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert (a > 0).all()
    assert abs(float(a.mean()) - 1.0) < 0.05 and abs(float(a.std()) - 1.0) < 0.05


@pytest.mark.parametrize("name", ["llama-tied-gqa", "qwen2-bias-untied"])
def test_model_on_triton_ops_matches_torch_ops(name: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The GPU path's model (fused glue, GEMV, split-K decode attention, fresh-prefill
    attention) computes what the reference path computes, prefill and decode."""
    from nib.engine.graphs_common import decode_attend_fn
    from nib.engine.kernels.gemv import swap_in_gemv
    from nib.engine.loader import load_model
    from nib.engine.ops import TritonOps, fresh_prefill_attention

    from .hf_models import save_hf_model

    save_hf_model(name, tmp_path)
    ref_model = load_model(tmp_path, device=DEVICE)
    ref_model.setup_cache(64)
    fast = load_model(tmp_path, device=DEVICE)
    fast.setup_cache(64)
    fast.ops = TritonOps()
    swap_in_gemv(fast, tune=False)
    cfg = fast.cfg
    attend = decode_attend_fn(
        DecodeAttention(cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, 64, DEVICE)
    )
    ids = torch.randint(0, cfg.vocab_size, (1, 9), device=DEVICE)
    positions = torch.arange(9, device=DEVICE)
    with torch.no_grad():
        expected = ref_model(ids, positions, 9)
        got = fast(ids[:, :6], positions[:6], attend=fresh_prefill_attention)
        assert rel_err(got, expected[:, :6]) < 1e-5
        for i in range(6, 9):
            step = fast(ids[:, i : i + 1], positions[i : i + 1], attend=attend)
            assert rel_err(step[0, 0], expected[0, i]) < 1e-5
