"""Which CUDA modules this process has loaded, per device, and whether they can be.

`module("w4a16.cu", device)` compiles (or finds in the cache) and loads a
source once per device. `available(device)` answers whether nib's CUDA
kernels can run here at all, with the reason when not: switched off by
`NIB_CUDA_KERNELS=0`, a GPU below sm_80, no nvcc, a failed build or load.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Iterable

import torch

from nib.engine.cuda import build, driver

log = logging.getLogger("nib.engine")

MIN_CAPABILITY = (8, 0)  # mma.sync m16n8k16 with fp32 accumulators, bf16 conversions
SOURCES = ("w4a16.cu", "greedy.cu", "gemv16.cu", "attention.cu", "embed.cu")

_lock = threading.Lock()
_modules: dict[tuple[str, int, tuple[str, ...]], driver.Module] = {}
_why_not: dict[int, str] = {}


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def trace_flags() -> tuple[str, ...]:
    """nvcc flags for the step timeline's builds: `NIB_CUDA_TRACE=1` compiles the
    kernels with -DNIB_TRACE, so that every block records when it started, waited and
    ended (common.cuh; read by bench/step_timeline.py). A benchmarking aid: those
    kernels pay an atomic and a store per block."""
    return ("-DNIB_TRACE",) if os.environ.get("NIB_CUDA_TRACE", "0") == "1" else ()


# Experiments in the kernel sources sit behind `#ifdef NIB_...` (the plain build is the
# code without them). NIB_CUDA_DEFINES="NIB_A,NIB_B=2" builds every module with them;
# bench/cuda_variants.py switches them within one process (set_defines) to time a
# variant against the plain build on the same weights. A benchmarking aid, not a setting.
# Every experiment the sources hold, and what it changes (tests/unit/test_cuda_build.py
# holds this list to the sources' #ifdefs and builds each one without spills).
# Those tried and closed: bench/README.md, "Kernel experiments against the plain build".
EXPERIMENTS: dict[str, str] = {}
_DEFINE = re.compile(r"NIB_[A-Z0-9_]+(=[A-Za-z0-9_.]+)?")
_defines: tuple[str, ...] | None = None  # None: not yet read from NIB_CUDA_DEFINES
generation = 0  # bumped by set_defines: Bound modules look themselves up again


def parse_defines(text: str, what: str = "NIB_CUDA_DEFINES") -> tuple[str, ...]:
    """ "NIB_A, NIB_B=2" -> ("NIB_A", "NIB_B=2"); ValueError naming `what` otherwise."""
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    for name in names:
        if not _DEFINE.fullmatch(name):
            raise ValueError(
                f"{what}: {name!r} is not NIB_<NAME> or NIB_<NAME>=<value> "
                "(upper-case letters, digits, underscores; a value of letters, digits, _ .)"
            )
        if name.split("=")[0] == "NIB_TRACE":
            raise ValueError(f"{what}: NIB_TRACE has its own switch, NIB_CUDA_TRACE=1")
    return names


def defines() -> tuple[str, ...]:
    """The experiment defines nib's CUDA modules are built with now (none by default)."""
    global _defines
    if _defines is None:
        _defines = parse_defines(os.environ.get("NIB_CUDA_DEFINES", ""))
    return _defines


def set_defines(names: Iterable[str]) -> None:
    """Build (or find built) every module looked up from now on with these defines;
    objects holding a Bound module switch at their next launch."""
    global _defines, generation
    chosen = parse_defines(",".join(names), "set_defines")
    with _lock:
        _defines = chosen
        generation += 1


def build_flags() -> tuple[str, ...]:
    """nvcc flags of the modules looked up now: the trace switch, then the defines."""
    return trace_flags() + tuple(f"-D{name}" for name in defines())


def module(source: str, device: torch.device) -> driver.Module:
    """The loaded module of `source` (a file beside this package) on `device`, built
    with build_flags()."""
    index = _index(device)
    flags = build_flags()
    key = (source, index, flags)
    with _lock:
        mod = _modules.get(key)
        if mod is None:
            cap = torch.cuda.get_device_capability(index)
            if defines():
                log.warning("%s built with experiment defines %s", source, ",".join(defines()))
            image = build.cubin(source, build.arch(cap), flags)
            mod = _modules[key] = driver.Module(image, torch.device("cuda", index), source)
        return mod


class Bound:
    """A source's module on a device for an object that launches its kernels again and
    again: looked up once, and again only after set_defines()."""

    def __init__(self, source: str, device: torch.device) -> None:
        self.source, self.device = source, device
        self._generation = generation
        self._module = module(source, device)

    def get(self) -> driver.Module:
        if self._generation != generation:
            self._module = module(self.source, self.device)
            self._generation = generation
        return self._module


def loaded(device: torch.device, traced: bool = False) -> list[driver.Module]:
    """The modules loaded on `device` so far: the traced builds, or the untraced ones."""
    index = _index(device)
    with _lock:
        return [
            m
            for (_, i, flags), m in _modules.items()
            if i == index and ("-DNIB_TRACE" in flags) == traced
        ]


def unavailable_reason(device: torch.device) -> str:
    """'' when nib's CUDA kernels run on `device`, else why not (checked once per device)."""
    if device.type != "cuda":
        return "not a CUDA device"
    if os.environ.get("NIB_CUDA_KERNELS", "1") == "0":
        return "switched off (NIB_CUDA_KERNELS=0)"
    index = _index(device)
    if index in _why_not:
        return _why_not[index]
    why = ""
    cap = torch.cuda.get_device_capability(index)
    if cap < MIN_CAPABILITY:
        why = f"sm_{cap[0]}{cap[1]} is below sm_{MIN_CAPABILITY[0]}{MIN_CAPABILITY[1]}"
    else:
        try:
            for source in SOURCES:
                module(source, device)
        except (build.CudaBuildError, driver.CudaError, OSError) as exc:
            why = f"{type(exc).__name__}: {exc}"
    if why:
        log.warning("nib CUDA kernels unavailable on cuda:%d (%s); using Triton", index, why)
    _why_not[index] = why
    return why


def available(device: torch.device) -> bool:
    return unavailable_reason(device) == ""


PDL_CAPABILITY = (9, 0)


def pdl(device: torch.device) -> bool:
    """Whether kernels on `device` launch with programmatic dependent launch (sm_90+):
    nib's kernels are written for it (weights first, griddepcontrol.wait before the
    previous kernel's outputs)."""
    if os.environ.get("NIB_CUDA_PDL", "1") == "0":
        return False
    return torch.cuda.get_device_capability(_index(device)) >= PDL_CAPABILITY
