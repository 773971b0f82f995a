"""The CUDA sources compile for Hopper and Ampere without spills (nvcc, no GPU needed).

Registers spilled to local memory would put every weight the INT4 kernel holds in
flight through L1 and DRAM a second time; a stack frame means an array was indexed
at run time. Both show up in ptxas's report, so they are checked on every CI run
where nvcc is installed (the GPU tests then run the same cubins).
"""

from __future__ import annotations

import re

import pytest
import torch

from nib.engine.cuda import build, loader
from tests.unit.cuda_tools import nvcc_or_skip

SOURCES = (*loader.SOURCES, "probe.cu")  # probe.cu: bench/micro_boundary.py only


@pytest.mark.parametrize("target", ["sm_90", "sm_80"])
@pytest.mark.parametrize("source", SOURCES)
def test_compiles_without_spills(source: str, target: str) -> None:
    nvcc_or_skip()
    report = build.resources(source, target)
    assert report, f"{source}: ptxas reported no kernels"
    for r in report:
        assert r.spill_stores == 0 and r.spill_loads == 0, f"{source} {target}: {r}"
        assert r.stack_bytes == 0, f"{source} {target}: {r}"
        assert r.registers <= 255


def _experiments_in_sources() -> set[str]:
    names: set[str] = set()
    for path in build.HERE.glob("*.cu*"):
        for m in re.finditer(r"#\s*if(?:n?def|\s+defined)\s*\(?\s*(NIB_\w+)", path.read_text()):
            names.add(m[1])
    return names - {"NIB_TRACE"}  # the step timeline's switch (NIB_CUDA_TRACE=1)


def test_the_experiment_list_is_the_sources_own() -> None:
    """Every `#ifdef NIB_...` in the sources is a listed experiment, and every listed
    experiment is in the sources: loader.EXPERIMENTS is what bench/cuda_variants.py
    offers and what the test below builds."""
    assert _experiments_in_sources() == set(loader.EXPERIMENTS)


def _experiment_builds() -> list[object]:
    """(source, define) for each source an experiment's #ifdef is in (directly or through
    common.cuh) and each experiment, and all of them together where there are several."""
    names = sorted(loader.EXPERIMENTS)
    if not names:
        reason = "no experiment is open in the kernel sources (loader.EXPERIMENTS is empty)"
        return [pytest.param("-", "-", marks=pytest.mark.skip(reason=reason))]
    if any(n in (build.HERE / "common.cuh").read_text() for n in names):
        sources = list(loader.SOURCES)
    else:
        sources = [
            s for s in loader.SOURCES if any(n in (build.HERE / s).read_text() for n in names)
        ]
    defines = names + (["all"] if len(names) > 1 else [])
    return [(source, define) for source in sources for define in defines]


@pytest.mark.parametrize("target", ["sm_90", "sm_80"])
@pytest.mark.parametrize("source,define", _experiment_builds())
def test_experiments_compile_without_spills(source: str, define: str, target: str) -> None:
    nvcc_or_skip()
    names = sorted(loader.EXPERIMENTS) if define == "all" else [define]
    flags = tuple(f"-D{name}" for name in names)
    report = build.resources(source, target, flags)
    assert {r.kernel for r in report} == {r.kernel for r in build.resources(source, target)}
    for r in report:
        assert r.spill_stores == 0 and r.spill_loads == 0, f"{source} {flags} {target}: {r}"
        assert r.stack_bytes == 0, f"{source} {flags} {target}: {r}"


def test_every_w4a16_config_has_a_kernel() -> None:
    """Each config the engine may pick names a kernel that the source defines."""
    from nib.engine.cuda import w4a16

    text = (build.HERE / "w4a16.cu").read_text()

    def defined(mt: int, cfg: w4a16.W4Config, staged: bool) -> bool:
        if cfg.xpf:
            macro = "W4_XPF_BULK_KERNEL" if cfg.bulk else "W4_XPF_KERNEL"
            return f"{macro}({mt}, {cfg.r}, {cfg.warps}, {cfg.pf})" in text
        macro = (
            "W4_BULK_KERNEL" if cfg.bulk else "W4_CLUSTER_KERNEL" if cfg.cluster else "W4_KERNEL"
        )
        src = "true, s" if staged else "false, g"
        return f"{macro}({mt}, {cfg.r}, {cfg.warps}, {cfg.pf}, {src})" in text

    for cfg in w4a16.ONE_ROW:
        assert defined(1, cfg, True), w4a16.kernel_name(1, cfg, True)
    for cfg in w4a16.MULTI_ROW:
        for mt in (1, 2):
            assert defined(mt, cfg, False), w4a16.kernel_name(mt, cfg, False)
    assert any(c.bulk for c in w4a16.ONE_ROW) and any(not c.bulk for c in w4a16.ONE_ROW)
    assert any(c.cluster for c in w4a16.ONE_ROW) and any(c.cluster for c in w4a16.MULTI_ROW)
    assert not any(c.xpf for c in w4a16.ONE_ROW)
    assert any(c.xpf and c.bulk for c in w4a16.MULTI_ROW)
    assert any(c.xpf and not c.bulk for c in w4a16.MULTI_ROW)


def test_xpf_configs_name_their_twins_and_fall_back_where_nothing_is_ahead() -> None:
    """An xpf config runs the `x` twin of its `g` kernel at 2..16 rows; one staged row has
    nothing to load ahead (effective() drops it), and a split or cluster xpf is refused."""
    from nib.engine.cuda import w4a16

    cfg = w4a16.W4Config(4, 4, 2, 1, bulk=True, xpf=True)
    assert cfg.label() == "int4 mma16 bulk r4w4n2 xpf"
    assert w4a16.W4Config(2, 4, 2, xpf=True).label() == "int4 mma16 r2w4p2 xpf"
    assert w4a16.kernel_name(2, cfg, False) == "w4a16_m2_r4_w4_n2_gbx"
    assert w4a16.kernel_name(1, w4a16.W4Config(2, 4, 2, xpf=True), False) == "w4a16_m1_r2_w4_p2_gx"
    # its plain twin is another kernel
    assert (
        w4a16.kernel_name(2, w4a16.W4Config(4, 4, 2, 1, bulk=True), False) == "w4a16_m2_r4_w4_n2_gb"
    )
    packed = object.__new__(w4a16.CudaInt4)  # effective() reads tiles and k only
    packed.tiles, packed.k = 1376, 4096
    assert packed.effective(cfg, 16).xpf and packed.effective(cfg, 2).xpf
    assert not packed.effective(cfg, 1).xpf
    for bad in (
        w4a16.W4Config(1, 4, 4, 2, xpf=True),
        w4a16.W4Config(1, 4, 4, 2, cluster=True, xpf=True),
    ):
        with pytest.raises(ValueError, match="xpf"):
            w4a16.kernel_name(1, bad, False)
    with pytest.raises(ValueError, match="xpf"):
        w4a16.kernel_name(1, w4a16.W4Config(1, 4, 4, xpf=True), True)  # staged


def test_cubin_cache_is_keyed_by_content(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    nvcc_or_skip()
    monkeypatch.setenv("NIB_CUDA_CACHE", str(tmp_path))
    src = tmp_path / "k.cu"
    src.write_text('extern "C" __global__ void k(int* p) { p[threadIdx.x] = 1; }\n')
    first = build.cubin(src, "sm_90")
    assert first[:4] == b"\x7fELF"
    assert len(list(tmp_path.glob("k-sm_90-*.cubin"))) == 1
    assert build.cubin(src, "sm_90") == first  # from the cache
    src.write_text('extern "C" __global__ void k(int* p) { p[threadIdx.x] = 2; }\n')
    build.cubin(src, "sm_90")
    assert len(list(tmp_path.glob("k-sm_90-*.cubin"))) == 2


def test_a_source_that_does_not_compile_says_why(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    nvcc_or_skip()
    monkeypatch.setenv("NIB_CUDA_CACHE", str(tmp_path))
    src = tmp_path / "bad.cu"
    src.write_text('extern "C" __global__ void k(int* p) { p[threadIdx.x] = undefined_name; }\n')
    with pytest.raises(build.CudaBuildError, match="undefined_name"):
        build.cubin(src, "sm_90")


def test_no_kernels_off_cuda() -> None:
    assert loader.unavailable_reason(torch.device("cpu")) == "not a CUDA device"
