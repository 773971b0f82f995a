"""The fused RoPE + KV-cache write + decode attention (engine/cuda/attention.cu) on the GPU.

Against the float64 reference of the same op (engine/cuda/attention.py `reference`:
RoPE rounded as the kernels round it, attention in float64), on fresh random inputs:
the Llama-2-7B and Qwen2.5-Coder-1.5B head shapes, the shipped tiny model's, and odd
ones (GQA groups 1, 3, 4, 6, 7, 8; head_dim 64 and 128), bf16 and fp16, lengths from 1
through every tile and split boundary to max_context. Outputs are poisoned with NaN
first and must come back fully written; the cache row at p must be bit for bit the
reference's and every other row untouched; the position is read from the device;
inside a CUDA graph replayed at increasing positions the results stay right and the
counters come back to zero. The output is compared before the reference rounds it:
the kernel's only error should be its own final rounding (bf16 2^-9, fp16 2^-12 per
element at most) plus ~1e-6.
"""

from __future__ import annotations

import math

import pytest
import torch

from nib.engine.cuda import loader
from nib.engine.cuda.attention import FusedDecodeAttention, plan, reference

pytestmark = pytest.mark.gpu
DEVICE = torch.device("cuda")

SHAPES = {
    "llama-2-7b": (32, 32, 128),
    "qwen2.5-coder-1.5b": (12, 2, 128),
    "nib-tiny": (6, 2, 64),
    "g8-d64": (8, 1, 64),
    "g7-d128": (7, 1, 128),
    "g1-d64": (3, 3, 64),
    "g4-d128": (16, 4, 128),
    "g3-d128": (9, 3, 128),
}
LENGTHS = (1, 2, 15, 16, 17, 31, 32, 33, 100, 257, 640, 1000, 4095, 4096)
TOL = {torch.bfloat16: 3e-3, torch.float16: 4e-4}  # relative, over the whole output


@pytest.fixture(autouse=True)
def _cuda_kernels() -> None:
    why = loader.unavailable_reason(DEVICE)
    if why:
        pytest.skip(f"nib's CUDA kernels do not run here: {why}")


def rope_tables(s: int, d: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """HF-layout tables (halves repeated) with theta 10000, as the model builds them."""
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2, device=DEVICE).float() / d))
    freqs = torch.outer(torch.arange(s, device=DEVICE).float(), inv)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


class Problem:
    """Random qkv row and caches for one shape; `check` runs the kernel at position p."""

    def __init__(
        self, name: str, s: int, dtype: torch.dtype, seed: int = 0, **kw: int | bool
    ) -> None:
        self.h, self.kvh, self.d = SHAPES[name]
        self.s, self.dtype, self.name = s, dtype, name
        self.gen = torch.Generator(device=DEVICE).manual_seed(seed)
        self.k = self.randn(1, self.kvh, s, self.d)
        self.v = self.randn(1, self.kvh, s, self.d)
        self.cos, self.sin = rope_tables(s, self.d, dtype)
        self.fused = FusedDecodeAttention(self.h, self.kvh, self.d, s, dtype, DEVICE, **kw)

    def randn(self, *shape: int, scale: float = 1.0) -> torch.Tensor:
        x = torch.randn(*shape, device=DEVICE, generator=self.gen, dtype=torch.float32)
        return (x * scale).to(self.dtype)

    def qkv(self) -> torch.Tensor:
        # Scale 2: scores of a few units, so the softmax is neither flat nor one-hot.
        return self.randn(1, 1, (self.h + 2 * self.kvh) * self.d, scale=2.0)

    def expected(
        self, qkv: torch.Tensor, p: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        k, v = self.k.clone(), self.v.clone()
        pos = torch.tensor([p], device=DEVICE)
        want = reference(qkv, pos, self.cos, self.sin, k, v, self.h, self.kvh, rounded=False)
        return want, k, v

    def compare(
        self,
        out: torch.Tensor,
        want: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
        what: str,
    ) -> None:
        o, k, v = want
        assert not out.isnan().any(), f"{what}: output not fully written"
        assert torch.equal(self.k, k), f"{what}: k cache differs (row p or others)"
        assert torch.equal(self.v, v), f"{what}: v cache differs (row p or others)"
        diff = out.double() - o
        err = float(diff.norm() / o.norm())
        # Per element: two units in the last place of its own size (one for the rounding,
        # one for the kernel's fp32 error), sizes floored at 1% of the largest.
        floor = 1e-2 * float(o.abs().max())
        worst = float((diff.abs() / o.abs().clamp_min(floor)).max())
        ulp2 = 2.0**-7 if self.dtype == torch.bfloat16 else 2.0**-10
        assert err <= TOL[self.dtype], f"{what}: relative error {err:.2e}"
        assert worst <= ulp2, f"{what}: an element off by {worst:.2e} of its size"

    def check(self, p: int, what: str = "") -> None:
        qkv = self.qkv()
        want = self.expected(qkv, p)
        out = torch.full((1, self.h, 1, self.d), math.nan, dtype=self.dtype, device=DEVICE)
        pos = torch.tensor([p], device=DEVICE)  # on the device: the kernel reads it there
        self.fused(qkv, pos, self.cos, self.sin, self.k, self.v, out=out)
        torch.cuda.synchronize()
        self.compare(out, want, f"{self.name} {self.dtype} L={p + 1} {what}")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", list(SHAPES))
def test_every_length_matches_the_float64_reference(name: str, dtype: torch.dtype) -> None:
    prob = Problem(name, 4096, dtype)
    for length in LENGTHS:
        prob.check(length - 1)
    assert not prob.fused.counters.any(), "a merging block left its counter set"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", ["qwen2.5-coder-1.5b", "nib-tiny", "llama-2-7b"])
def test_max_context(name: str, dtype: torch.dtype) -> None:
    s = 8192 if name == "llama-2-7b" else 32768
    prob = Problem(name, s, dtype, seed=1)
    for length in (s, s - 1, s // 2 + 3, 1):
        prob.check(length - 1)


def _cluster_runs() -> bool:
    from nib.engine.cuda.attention import CLUSTER_CAPABILITY

    return torch.cuda.get_device_capability(DEVICE) >= CLUSTER_CAPABILITY


@pytest.mark.parametrize("merge", ["global", "cluster"])
@pytest.mark.parametrize("warps", [4, 8])
@pytest.mark.parametrize("splits", [1, 2, 7, 8, 33, 64])
@pytest.mark.parametrize("name", ["llama-2-7b", "qwen2.5-coder-1.5b", "g8-d64"])
def test_every_launch_shape(name: str, splits: int, warps: int, merge: str) -> None:
    """Both ways of merging the splits: the last block to arrive reads them from global
    memory, or (sm_90, up to 8 splits) the cluster's first block reads them from the
    others' shared memory."""
    cluster = merge == "cluster"
    if cluster and (splits > 8 or not _cluster_runs()):
        pytest.skip("a cluster merge takes 1..8 splits on sm_90")
    prob = Problem(
        name, 2048, torch.bfloat16, seed=splits, splits=splits, warps=warps, cluster=cluster
    )
    assert prob.fused.shape.cluster == cluster
    for length in (1, 17, 16 * splits, 16 * splits + 1, 700, 2048):
        if length <= 2048:
            prob.check(length - 1, f"{prob.fused.shape.label()}")
    assert not prob.fused.counters.any()


def test_the_default_merges_in_a_cluster_where_it_can() -> None:
    from nib.engine.cuda.attention import cluster_default

    prob = Problem("qwen2.5-coder-1.5b", 1024, torch.bfloat16, splits=8)
    assert prob.fused.shape.cluster == _cluster_runs() == cluster_default(8, DEVICE)
    assert not cluster_default(9, DEVICE) and not cluster_default(1, DEVICE)
    with pytest.raises(ValueError, match=r"1\.\.8 splits"):
        Problem("qwen2.5-coder-1.5b", 1024, torch.bfloat16, splits=9, cluster=True)


def test_positions_not_at_the_end_of_the_filled_cache() -> None:
    """The kernel attends over [0, p] only: stale rows after p (a rolled-back position)
    are never read, and rewriting p is idempotent."""
    prob = Problem("qwen2.5-coder-1.5b", 1024, torch.float16, seed=5)
    for p in (900, 10, 500, 10, 0, 1023):
        prob.check(p)


def test_a_position_outside_the_cache_writes_nothing() -> None:
    prob = Problem("nib-tiny", 256, torch.bfloat16, seed=6)
    k, v = prob.k.clone(), prob.v.clone()
    for p in (256, 10_000, -1):
        out = torch.full((1, prob.h, 1, prob.d), math.nan, dtype=prob.dtype, device=DEVICE)
        bad = torch.tensor([p], device=DEVICE)
        prob.fused(prob.qkv(), bad, prob.cos, prob.sin, prob.k, prob.v, out=out)
        torch.cuda.synchronize()
        assert out.isnan().all() and torch.equal(prob.k, k) and torch.equal(prob.v, v)
    prob.check(255)  # and the counters were not disturbed


@pytest.mark.parametrize("merge", ["global", "cluster"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", ["llama-2-7b", "qwen2.5-coder-1.5b", "nib-tiny"])
def test_in_a_cuda_graph_replayed_at_increasing_positions(
    name: str, dtype: torch.dtype, merge: str
) -> None:
    if merge == "cluster" and not _cluster_runs():
        pytest.skip("a cluster merge needs sm_90")
    splits = {"cluster": {"splits": 8, "cluster": True}, "global": {"cluster": False}}[merge]
    prob = Problem(name, 4096, dtype, seed=2, **splits)
    qkv = prob.qkv()
    pos = torch.zeros(1, dtype=torch.long, device=DEVICE)
    out = torch.empty((1, prob.h, 1, prob.d), dtype=dtype, device=DEVICE)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        prob.fused(qkv, pos, prob.cos, prob.sin, prob.k, prob.v, out=out)  # warm up
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        prob.fused(qkv, pos, prob.cos, prob.sin, prob.k, prob.v, out=out)
    positions = [0, 1, 2, 15, 16, 17, 100, 639, 640, 641, 1500, 4000, 4095]
    for p in positions:
        qkv.copy_(prob.qkv())
        pos.fill_(p)
        want = prob.expected(qkv, p)
        out.fill_(math.nan)
        graph.replay()
        torch.cuda.synchronize()
        prob.compare(out, want, f"{name} {dtype} graph replay at p={p}")
        first = out.clone()
        out.fill_(math.nan)
        graph.replay()  # the same inputs again: the same bits (a fixed merge order)
        torch.cuda.synchronize()
        assert torch.equal(out, first), f"replay at p={p} is not deterministic"
    assert not prob.fused.counters.any()


# What the Triton rope kernel promises against the PyTorch reference (tests/unit/
# test_kernels.py): a relative error, not bits. On the H200 it lands up to two bf16 ulps
# from the reference on a few elements of a row; the fused kernel matches the
# reference bit for bit (every test above).
TRITON_ROPE_TOL = {torch.float16: 2e-3, torch.bfloat16: 1e-2}


def same_cache_up_to_row(
    fused: torch.Tensor, triton: torch.Tensor, p: int, tol: float | None = None
) -> None:
    """Rows other than p identical; row p (written by each path) within `tol` (default:
    the Triton rope kernel's own tolerance; 0: identical)."""
    others = torch.ones(fused.shape[2], dtype=torch.bool, device=fused.device)
    others[p] = False
    assert torch.equal(fused[:, :, others], triton[:, :, others]), "rows other than p differ"
    a, b = fused[:, :, p].float(), triton[:, :, p].float()
    if tol == 0:
        assert torch.equal(a, b), f"row {p} differs"
        return
    rel = float((a - b).norm() / b.norm())
    limit = TRITON_ROPE_TOL[fused.dtype] if tol is None else tol
    assert rel < limit, f"row {p}: relative difference {rel:.2e}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", ["llama-2-7b", "qwen2.5-coder-1.5b", "nib-tiny", "g8-d64"])
def test_agrees_with_the_triton_pair_it_replaces(name: str, dtype: torch.dtype) -> None:
    from nib.engine.kernels.decode_attention import DecodeAttention
    from nib.engine.kernels.rope_cache import rope_cache

    prob = Problem(name, 2048, dtype, seed=3)
    triton_attention = DecodeAttention(prob.h, prob.kvh, prob.d, 2048, DEVICE)
    for length in (1, 33, 640, 2048):
        p = length - 1
        qkv = prob.qkv()
        pos = torch.tensor([p], device=DEVICE)
        k, v = prob.k.clone(), prob.v.clone()
        want = prob.expected(qkv, p)[0]  # float64, from the caches before either writes
        q = rope_cache(qkv, pos, prob.cos, prob.sin, k, v, prob.h, prob.kvh)
        tri = triton_attention(q, k, v, pos)
        got = prob.fused(qkv, pos, prob.cos, prob.sin, prob.k, prob.v)
        torch.cuda.synchronize()
        same_cache_up_to_row(prob.k, k, p)
        assert torch.equal(prob.v, v)
        # Each against the float64 reference: the fused kernel within the tolerance, and
        # no further from it than the pair it replaces (which, over long contexts, is
        # the less exact of the two: its RoPE rounds differently).
        fused_err = float((got.double() - want).norm() / want.norm())
        tri_err = float((tri.double() - want).norm() / want.norm())
        what = f"{name} L={length}: fused {fused_err:.2e}, Triton pair {tri_err:.2e}"
        assert fused_err <= TOL[dtype], what
        assert fused_err <= tri_err + TOL[dtype] / 2, what


def test_the_split_plan_the_kernel_uses() -> None:
    """Blocks past `used` exit before touching anything: at L = 17 with 8 splits only
    two blocks work, and the result is still right (see plan())."""
    assert plan(17, 8) == (16, 2)
    prob = Problem("qwen2.5-coder-1.5b", 512, torch.bfloat16, seed=4, splits=8)
    prob.check(16)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@torch.inference_mode()
def test_decode_steps_of_a_model_match_the_triton_path(
    arch: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Attention.heads with the fused callable (the decode graph's attend) against the
    Triton rope_cache + split-K pair, step by step after a prefill: same logits within
    the 16-bit tolerance, same cache contents."""
    from nib.engine.graphs_common import decode_attend_fn
    from nib.engine.kernels.decode_attention import DecodeAttention
    from nib.engine.kernels.gemv import swap_in_gemv
    from nib.engine.loader import load_model
    from nib.engine.ops import TritonOps, fresh_prefill_attention

    from .models import save_random_hf_model

    model_dir = save_random_hf_model(arch, tmp_path_factory.mktemp(arch))
    model = load_model(model_dir, device="cuda", dtype=torch.bfloat16)
    model.setup_cache(512)
    model.ops = TritonOps()
    swap_in_gemv(model, tune=False)
    cfg = model.cfg
    attention = DecodeAttention(cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, 512, DEVICE)
    fused = FusedDecodeAttention(
        cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, 512, torch.bfloat16, DEVICE
    )
    triton_attend = decode_attend_fn(attention)
    fused_attend = decode_attend_fn(attention, fused)
    assert hasattr(fused_attend, "rope_attend") and not hasattr(triton_attend, "rope_attend")
    ids = torch.randint(0, 256, (1, 40), device=DEVICE)
    model(ids[:, :24], torch.arange(24, device=DEVICE), attend=fresh_prefill_attention)
    for i in range(24, 40):
        pos = torch.tensor([i], device=DEVICE)
        a = model(ids[:, i : i + 1], pos, attend=triton_attend).float()
        caches = [
            (la.attention.cache.k.clone(), la.attention.cache.v.clone()) for la in model.layers
        ]
        b = model(ids[:, i : i + 1], pos, attend=fused_attend).float()
        for depth, (layer, (k, v)) in enumerate(zip(model.layers, caches, strict=True)):
            # Layer 0 writes the same inputs' k (up to the Triton RoPE) and v (exactly);
            # deeper layers' new rows come from hidden states the two paths rounded
            # differently, so they agree within the logits' tolerance.
            cache = layer.attention.cache
            same_cache_up_to_row(cache.k, k, i, None if depth == 0 else 2e-2)
            same_cache_up_to_row(cache.v, v, i, 0 if depth == 0 else 2e-2)
        err = float((a - b).norm() / a.norm())
        assert err < 2e-2, f"step {i}: logits differ by {err:.2e}"
