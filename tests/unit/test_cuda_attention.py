"""The fused decode attention (engine/cuda/attention.cu) without a GPU: it compiles for
sm_90 and sm_80 with no spills and no stack frame, its wrapper rejects what the kernel
cannot run and names the rule, and its PyTorch reference is the model's own reference
path (rope_cache_ref, then eager attention) for one decode step. The kernel's lane
arithmetic is replayed in test_cuda_attention_sim.py; tests/gpu runs it for real."""

from __future__ import annotations

import pytest
import torch

from nib.engine.cuda import attention as fused
from nib.engine.cuda import build
from tests.unit.cuda_tools import nvcc_or_skip

KERNELS = {
    f"rope_attend_d{d}_{dt}_w{w}{merge}"
    for d in (64, 128)
    for dt in ("bf16", "f16")
    for w in (4, 8)
    for merge in ("", "_cluster")  # splits merged through global memory, or in a cluster
}


@pytest.mark.parametrize("target", ["sm_90", "sm_80"])
def test_every_kernel_compiles_without_spills(target: str) -> None:
    nvcc_or_skip()
    report = {r.kernel: r for r in build.resources("attention.cu", target)}
    assert set(report) == KERNELS
    for r in report.values():
        assert r.spill_stores == r.spill_loads == 0, r
        assert r.stack_bytes == 0, r
        # One block of 8 warps per SM must fit the register file.
        assert r.registers <= 255 and (r.registers * 256 <= 65536 or "w4" in r.kernel), r
        assert r.shared_bytes == 0, r  # all shared memory is dynamic (shared_bytes())


def test_shared_memory_fits_every_gpu_from_sm_80() -> None:
    for d in fused.HEAD_DIMS:
        for w in fused.WARPS:
            assert fused.shared_bytes(d, w) <= 163 * 1024  # an A100's per-block maximum
            # A cluster launch's first block holds a slot per split (sm_90: 227 KB a block).
            slot = 8 * d * 4 + 8 * 2 * 4
            most = fused.shared_bytes(d, w, fused.MAX_CLUSTER)
            assert most == fused.shared_bytes(d, w) + (fused.MAX_CLUSTER - 1) * slot
            assert most <= 227 * 1024


@pytest.mark.parametrize(
    "shape,rule",
    [
        ((32, 32, 96, torch.float16), "head_dim 96"),
        ((12, 5, 128, torch.float16), "split evenly"),
        ((32, 2, 128, torch.bfloat16), "GQA group 16"),
        ((32, 32, 128, torch.float32), "not bf16 or fp16"),
    ],
)
def test_unsupported_shapes_name_the_rule(shape: tuple, rule: str) -> None:
    assert rule in fused.unsupported(*shape)
    model, why = fused.for_model(*shape[:3], 1024, shape[3], torch.device("cpu"))
    assert model is None and rule in why


def test_supported_shapes() -> None:
    for shape in ((32, 32, 128), (12, 2, 128), (6, 2, 64), (8, 1, 64), (28, 4, 128)):
        for dtype in (torch.bfloat16, torch.float16):
            assert fused.unsupported(*shape, dtype) == ""


def test_no_cuda_device_means_no_fused_kernel() -> None:
    model, why = fused.for_model(12, 2, 128, 1024, torch.float16, torch.device("cpu"))
    assert model is None and "unavailable" in why


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("heads,kv_heads,d", [(6, 2, 64), (4, 4, 128), (8, 1, 64)])
@pytest.mark.parametrize("position", [0, 15, 16, 37])
def test_reference_is_the_models_reference_path(
    dtype: torch.dtype, heads: int, kv_heads: int, d: int, position: int
) -> None:
    from nib.engine.kv_cache import KVCache
    from nib.engine.ops import TorchOps

    s = 48
    gen = torch.Generator().manual_seed(position + 7 * heads)
    qkv = torch.randn(1, 1, (heads + 2 * kv_heads) * d, generator=gen).to(dtype)
    angles = torch.rand(s, d // 2, generator=gen) * 6.3
    cos = torch.cat((angles.cos(), angles.cos()), -1).to(dtype)
    sin = torch.cat((angles.sin(), angles.sin()), -1).to(dtype)
    cache = KVCache(s, kv_heads, d, dtype, torch.device("cpu"))
    cache.k.copy_(torch.randn(cache.k.shape, generator=gen))
    cache.v.copy_(torch.randn(cache.v.shape, generator=gen))
    k0, v0 = cache.k.clone(), cache.v.clone()
    pos = torch.tensor([position])

    ops = TorchOps()
    q = ops.rope_cache(qkv, pos, cos, sin, cache, heads, kv_heads)
    # The eager path's mask reads the whole cache; stale rows past p must not matter.
    want = ops.attend(q, cache, pos, None)

    k1, v1 = k0.clone(), v0.clone()
    got = fused.reference(qkv, pos, cos, sin, k1, v1, heads, kv_heads)
    assert torch.equal(k1, cache.k) and torch.equal(v1, cache.v)  # same row p, same rest
    assert got.shape == want.shape == (1, heads, 1, d) and got.dtype == dtype
    err = float((got.float() - want.float()).norm() / want.float().norm())
    assert err < (2e-2 if dtype == torch.bfloat16 else 2e-3), err


def _paths(tmp_path, **runner_fields):  # type: ignore[no-untyped-def]
    from types import SimpleNamespace

    from nib.engine.kernel_paths import gpu_paths
    from nib.engine.loader import load_model

    from .hf_models import save_hf_model

    save_hf_model("llama-tied-gqa", tmp_path)
    model = load_model(tmp_path, device=torch.device("cpu"))
    runner = SimpleNamespace(
        verify_buckets=(4, 8), chunk_buckets=(4, 8, 16, 32), buckets=(16, 32, 64), **runner_fields
    )
    n = len(model.layers)
    return {(p.op, p.rows): p for p in gpu_paths(model, runner) if p.layer == f"layers.0-{n - 1}"}


def test_kernel_paths_say_the_decode_step_runs_the_fused_kernel(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from types import SimpleNamespace

    label = "cuda fused rope+kv-write+split-K decode attention s4w8"
    fake = SimpleNamespace(label=lambda: label)
    by = _paths(tmp_path, fused_attention=fake, fused_attention_why="")
    assert by[("attention.decode", "1")].kernel == label
    assert by[("attention.decode", "1")].graphs == "decode"
    rope_1 = by[("rope_cache", "1")]
    assert "fused decode attention" in rope_1.kernel and rope_1.graphs == "decode"
    rope_many = by[("rope_cache", "4-64")]
    assert rope_many.kernel.startswith("triton rope_cache")
    assert rope_many.graphs == "verify-4,8; chunk-4..32; prefill-16..64"
    assert ("rope_cache", "any") not in by
    assert not any(p.fallback for p in by.values())


@pytest.mark.parametrize(
    "why,fallback",
    [
        ("cuda kernels unavailable: CudaBuildError: nvcc not found", True),
        ("cuda kernels unavailable: switched off (NIB_CUDA_KERNELS=0)", False),
        ("head_dim 96 is not one of (64, 128)", False),
    ],
)
def test_kernel_paths_say_why_the_decode_step_runs_triton(tmp_path, why, fallback) -> None:  # type: ignore[no-untyped-def]
    by = _paths(tmp_path, fused_attention=None, fused_attention_why=why)
    decode = by[("attention.decode", "1")]
    assert decode.kernel.startswith("triton split-K decode attention") and why in decode.kernel
    assert decode.fallback is fallback
    assert by[("rope_cache", "any")].kernel.startswith("triton rope_cache")


def test_the_cluster_merge_runs_only_where_every_cluster_fits() -> None:
    """The default asks the driver how many clusters fit at once; a driver that cannot
    say keeps the global merge (never the Triton pair)."""
    from types import SimpleNamespace

    from nib.engine.cuda.driver import CudaError

    def kernel(fit: int | None) -> SimpleNamespace:
        def ask(grid, block, shared, cluster):  # type: ignore[no-untyped-def]
            assert grid == (8, 2) and block == (256,) and cluster == (8,) and shared == 1000
            if fit is None:
                raise CudaError("cuOccupancyMaxActiveClusters failed")
            return fit

        return SimpleNamespace(max_active_clusters=ask)

    assert fused._clusters_fit(kernel(15), 8, 2, 8, 1000)
    assert fused._clusters_fit(kernel(2), 8, 2, 8, 1000)
    assert not fused._clusters_fit(kernel(1), 8, 2, 8, 1000)  # a second wave
    assert not fused._clusters_fit(kernel(None), 8, 2, 8, 1000)
