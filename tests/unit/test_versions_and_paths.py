"""Versions and the kernels' build identity; the compute-capability floor; which kernel
each layer runs, merged over layers that agree."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from nib.engine import versions
from nib.engine.kernel_paths import KernelPath, compact, gpu_paths, reference_paths
from nib.engine.versions import UnsupportedDevice, collect_versions, kernels_supported

from .hf_models import save_hf_model


def test_cpu_versions_name_the_stack_and_leave_the_gpu_empty() -> None:
    v = collect_versions(torch.device("cpu"))
    assert v.torch == torch.__version__ and v.nib and v.python
    assert v.gpu == v.compute_capability == v.kernels_build == v.cuda_driver == ""


def test_kernels_build_id_follows_the_kernel_sources(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    build_id = versions.kernels_build_id.__wrapped__  # uncached
    engine = Path(versions.__file__).resolve().parent
    copy = tmp_path / "engine"
    shutil.copytree(engine, copy, ignore=shutil.ignore_patterns("__pycache__", "assets"))
    monkeypatch.setattr(versions, "_ENGINE", copy)
    first = build_id()
    assert first.startswith("src-") and " triton-" in first
    assert build_id() == first
    (copy / "README-not-a-kernel.txt").write_text("x")
    assert build_id() == first  # only the kernels count
    norm = copy / "kernels" / "norm.py"
    norm.write_text(norm.read_text() + "\n# changed\n")
    assert build_id() != first


def test_below_the_compute_capability_floor_refuses_unless_allowed() -> None:
    assert kernels_supported((9, 0), "H200", allow_reference_fallback=False)
    assert kernels_supported((8, 0), "A100", allow_reference_fallback=False)
    with pytest.raises(UnsupportedDevice) as info:
        kernels_supported((7, 5), "Tesla T4", allow_reference_fallback=False)
    message = str(info.value)
    assert "Tesla T4 has compute capability 7.5" in message
    assert "need 8.0 or newer" in message and "--allow-reference-fallback" in message
    assert not kernels_supported((7, 5), "Tesla T4", allow_reference_fallback=True)


def test_compact_merges_consecutive_layers_only() -> None:
    def p(layer: str, kernel: str = "k") -> KernelPath:
        return KernelPath(layer, "linear", "1", kernel)

    paths = [p(f"layers.{i}.wo", "slow" if i == 2 else "k") for i in range(5)] + [p("output")]
    assert [(x.layer, x.kernel) for x in compact(paths)] == [
        ("layers.0-1.wo", "k"),
        ("layers.2.wo", "slow"),
        ("layers.3-4.wo", "k"),
        ("output", "k"),
    ]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    from nib.engine.loader import load_model

    folder = Path(tmp_path_factory.mktemp("llama"))
    save_hf_model("llama-tied-gqa", folder)
    m = load_model(folder, device=torch.device("cpu"))
    m.setup_cache(64)
    return m


def test_reference_paths_of_the_cpu_engine(model) -> None:  # type: ignore[no-untyped-def]
    paths = reference_paths(model, fallback=False)
    n = len(model.layers)
    layers = {(p.layer, p.op) for p in paths}
    assert (f"layers.0-{n - 1}.attention.wqkv", "linear") in layers
    assert ("output", "linear") in layers
    assert all(not p.fallback and p.graphs == "" for p in paths)
    assert all(p.kernel.startswith("torch") for p in paths)
    assert all(p.fallback for p in reference_paths(model, fallback=True))


def test_gpu_paths_name_the_kernel_and_graphs_per_row_class(model) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("triton")
    import copy

    from nib.engine.kernels.gemv import swap_in_gemv

    m = copy.deepcopy(model)
    swap_in_gemv(m, tune=False)
    runner = SimpleNamespace(
        verify_buckets=(4, 8), chunk_buckets=(4, 8, 16, 32), buckets=(16, 32, 64)
    )
    paths = gpu_paths(m, runner)  # type: ignore[arg-type]
    n = len(m.layers)
    by = {(p.layer, p.op, p.rows): p for p in paths}
    qkv_1 = by[(f"layers.0-{n - 1}.attention.wqkv", "linear", "1")]
    assert qkv_1.kernel == "gemv-4x512w4 +norm" and qkv_1.graphs == "decode"
    qkv_many = by[(f"layers.0-{n - 1}.attention.wqkv", "linear", "4-64")]
    assert qkv_many.kernel == "cublas"
    assert qkv_many.graphs == "verify-4,8; chunk-4..32; prefill-16..64"
    head_1 = by[("output", "linear", "1")]  # the lm_head projects one row per prefill/chunk
    assert head_1.graphs == "decode; prefill-16..64; chunk-4..32"
    # Only the verify graphs give the lm_head more than one row: no entry beyond them.
    assert by[("output", "linear", "4-8")].graphs == "verify-4,8"
    assert all(p.graphs for p in paths if p.op == "linear")
    assert by[(f"layers.0-{n - 1}", "attention.multi", "4-32")].graphs == "verify-4,8; chunk-4..32"
    assert not any(p.fallback for p in paths)
    # A runner without the CUDA embedding kernel looks rows up with PyTorch's everywhere.
    assert by[("tok_embeddings", "embedding", "any")].kernel == "torch embedding"
    runner.embed = SimpleNamespace(label="cuda embed_rows")  # type: ignore[attr-defined]
    by = {(p.layer, p.op, p.rows): p for p in gpu_paths(m, runner)}  # type: ignore[arg-type]
    assert by[("tok_embeddings", "embedding", "1")].kernel == "cuda embed_rows"
    assert by[("tok_embeddings", "embedding", "1")].graphs == "decode"
    many = by[("tok_embeddings", "embedding", "4-64")]
    assert many.kernel == "torch embedding"
    assert many.graphs == "verify-4,8; chunk-4..32; prefill-16..64"
