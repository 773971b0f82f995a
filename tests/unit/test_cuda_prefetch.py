"""The L2 prefetch chain (engine/cuda/prefetch.py), on the CPU: which bytes each layer
prefetches, the argument struct's layout against common.cuh (compiled, where nvcc
is), and the settings' validation. The GPU side is tests/gpu/test_l2_prefetch.py."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest

from nib.engine.cuda import build
from nib.engine.cuda.prefetch import (
    ALIGN,
    RANGES,
    PrefetchArgs,
    make,
    settings,
    upcoming,
)
from tests.unit.cuda_tools import nvcc_or_skip

MB = 2**20


def test_whole_next_layers_while_they_fit_then_a_fraction_of_each_range() -> None:
    chain = [
        [(0x1000, 4 * MB)],
        [(0x10_0000_0000, 2 * MB), (0x20_0000_0000, 64 * 1024)],  # INT4: codes + scales
        [(0x30_0000_0000, 8 * MB)],
        [(0x40_0000_0000, 1 * MB)],
    ]
    # Layer 0 with 6 MB: all of layer 1 (2 MB + 64 KB), then half-ish of layer 2.
    got = upcoming(chain, 0, 6 * MB)
    assert got[:2] == [(0x10_0000_0000, 2 * MB), (0x20_0000_0000, 64 * 1024)]
    assert got[2][0] == 0x30_0000_0000
    assert got[2][1] == (6 * MB - 2 * MB - 64 * 1024) // ALIGN * ALIGN
    assert sum(n for _, n in got) <= 6 * MB
    # A layer bigger than the budget: the same fraction of its codes and its scales.
    got = upcoming(chain, 0, 1 * MB)
    assert [a for a, _ in got] == [0x10_0000_0000, 0x20_0000_0000]
    assert got[0][1] == MB * 2 * MB // (2 * MB + 64 * 1024) // ALIGN * ALIGN
    assert got[1][1] < 64 * 1024
    # The lm_head (last) prefetches the first layer: the next step starts there.
    assert upcoming(chain, 3, 1 * MB) == [(0x1000, 1 * MB)]


def test_never_more_ranges_than_the_kernel_holds_nor_itself() -> None:
    chain = [[(0x1000 * (i + 1), 4096)] for i in range(10)]
    got = upcoming(chain, 2, 100 * MB)
    assert len(got) == RANGES
    assert (0x3000, 4096) not in got  # its own weight is streaming already
    assert [a for a, _ in got] == [0x4000, 0x5000, 0x6000, 0x7000]


def test_empty_layers_are_skipped_and_a_zero_budget_prefetches_nothing() -> None:
    chain = [[(0x1000, 4096)], [], [(0x2000, 4096)]]
    assert upcoming(chain, 0, MB) == [(0x2000, 4096)]  # and not itself, after wrapping
    assert upcoming(chain, 1, MB) == [(0x2000, 4096), (0x1000, 4096)]
    assert upcoming(chain, 0, 0) == []


def test_make_rejects_what_the_kernel_cannot_prefetch() -> None:
    with pytest.raises(ValueError, match="16-byte aligned"):
        make([(0x1001, 256)], False)
    with pytest.raises(ValueError, match="16-byte aligned"):
        make([(0x1000, 255)], False)
    with pytest.raises(ValueError, match="at most 4 ranges"):
        make([(0x1000, 256)] * 5, False)
    args = make([(0x1000, 256), (0x2000, 512)], True)
    assert args.ranges() == [(0x1000, 256), (0x2000, 512)]
    assert args.hint == 1


def test_settings_name_the_variable_and_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NIB_L2_PREFETCH_MB", "8")
    monkeypatch.setenv("NIB_L2_EVICT_FIRST", "0")
    assert settings() == (8 * MB, False)
    monkeypatch.setenv("NIB_L2_PREFETCH_MB", "lots")
    with pytest.raises(ValueError, match="NIB_L2_PREFETCH_MB must be a number"):
        settings()
    monkeypatch.setenv("NIB_L2_PREFETCH_MB", "-1")
    with pytest.raises(ValueError, match="between 0 and 1024"):
        settings()
    monkeypatch.setenv("NIB_L2_PREFETCH_MB", "0")
    monkeypatch.setenv("NIB_L2_EVICT_FIRST", "yes")
    with pytest.raises(ValueError, match="NIB_L2_EVICT_FIRST must be 0 or 1"):
        settings()


def _layout_asserts(struct: str, cls: type[ctypes.Structure]) -> str:
    lines = [f'static_assert(sizeof({struct}) == {ctypes.sizeof(cls)}, "size of {struct}");']
    for name, *_ in cls._fields_:
        off = getattr(cls, name).offset
        lines.append(
            f'static_assert(__builtin_offsetof({struct}, {name}) == {off}, "{struct}.{name}");'
        )
    return "\n".join(lines)


@pytest.mark.slow
@pytest.mark.parametrize("source", ["gemv16.cu", "w4a16.cu"])
def test_the_ctypes_structs_match_the_kernels_structs(
    source: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The argument structs, field by field, as nvcc lays them out (a mismatch would hand
    the kernel garbage pointers)."""
    nvcc_or_skip()
    torch = pytest.importorskip("torch")
    del torch
    from nib.engine.cuda.gemv16 import G16Args
    from nib.engine.cuda.w4a16 import W4Args

    struct, cls = ("G16Args", G16Args) if source == "gemv16.cu" else ("W4Args", W4Args)
    probe = tmp_path / f"layout_{struct}.cu"
    probe.write_text(
        f'#include "{build.HERE / source}"\n'
        + _layout_asserts("Prefetch", PrefetchArgs)
        + "\n"
        + _layout_asserts(struct, cls)
        + "\n"
    )
    monkeypatch.setenv("NIB_CUDA_CACHE", str(tmp_path / "cache"))  # the include is not hashed
    build.cubin(probe, "sm_90")  # compiles only if every assertion holds
