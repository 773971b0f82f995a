"""The ctypes argument structs against the CUDA kernels' structs, field by field, as nvcc
lays them out: a mismatch hands a kernel garbage pointers. A probe file includes the
kernel source and static_asserts every size and offset; it compiles only if all hold.
Skipped where nvcc is absent."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest

from nib.engine.cuda import build
from tests.unit.cuda_tools import nvcc_or_skip

pytest.importorskip("torch")


def _layout_asserts(struct: str, cls: type[ctypes.Structure]) -> str:
    lines = [f'static_assert(sizeof({struct}) == {ctypes.sizeof(cls)}, "size of {struct}");']
    for name, *_ in cls._fields_:
        off = getattr(cls, name).offset
        lines.append(
            f'static_assert(__builtin_offsetof({struct}, {name}) == {off}, "{struct}.{name}");'
        )
    return "\n".join(lines)


from nib.engine.cuda.attention import RopeAttnArgs  # noqa: E402
from nib.engine.cuda.embed import EmbedArgs  # noqa: E402
from nib.engine.cuda.gemv16 import G16Args  # noqa: E402
from nib.engine.cuda.greedy import GreedyArgs  # noqa: E402
from nib.engine.cuda.w4a16 import DequantArgs, PickPtrs, W4Args, W4PickArgs  # noqa: E402
from tests.bench_modules import load_bench  # noqa: E402

_probe = load_bench("micro_boundary")  # probe.cu's ctypes twins live in its bench script
ProbeArgs, PhaseArgs, RingArgs = _probe.ProbeArgs, _probe.PhaseArgs, _probe.RingArgs

STRUCTS = [  # (kernel source, struct name, its ctypes twin)
    ("gemv16.cu", "G16Args", G16Args),
    ("w4a16.cu", "W4Args", W4Args),
    ("w4a16.cu", "DequantArgs", DequantArgs),
    ("w4a16.cu", "PickPtrs", PickPtrs),
    ("w4a16.cu", "W4PickArgs", W4PickArgs),
    ("attention.cu", "RopeAttnArgs", RopeAttnArgs),
    ("greedy.cu", "GreedyArgs", GreedyArgs),
    ("embed.cu", "EmbedArgs", EmbedArgs),
    ("probe.cu", "ProbeArgs", ProbeArgs),
    ("probe.cu", "PhaseArgs", PhaseArgs),
    ("probe.cu", "RingArgs", RingArgs),
]


@pytest.mark.slow
@pytest.mark.parametrize(("source", "struct", "cls"), STRUCTS, ids=[s for _, s, _ in STRUCTS])
def test_the_ctypes_structs_match_the_kernels_structs(
    source: str,
    struct: str,
    cls: type[ctypes.Structure],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    nvcc_or_skip()
    probe = tmp_path / f"layout_{struct}.cu"
    probe.write_text(f'#include "{build.HERE / source}"\n{_layout_asserts(struct, cls)}\n')
    monkeypatch.setenv("NIB_CUDA_CACHE", str(tmp_path / "cache"))  # the include is not hashed
    build.cubin(probe, "sm_90")


def test_a_wrong_offset_does_not_compile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe can fail: one offset off by eight is a compile error."""
    nvcc_or_skip()
    probe = tmp_path / "wrong.cu"
    off = W4Args.eps.offset + 8
    probe.write_text(
        f'#include "{build.HERE / "w4a16.cu"}"\n'
        f'static_assert(__builtin_offsetof(W4Args, eps) == {off}, "W4Args.eps");\n'
    )
    monkeypatch.setenv("NIB_CUDA_CACHE", str(tmp_path / "cache"))
    with pytest.raises(build.CudaBuildError, match=r"W4Args\.eps"):
        build.cubin(probe, "sm_90")
