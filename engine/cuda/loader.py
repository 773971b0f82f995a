"""Which CUDA modules this process has loaded, per device, and whether they can be.

`module("w4a16.cu", device)` compiles (or finds in the cache) and loads a
source once per device. `available(device)` answers whether nib's CUDA
kernels can run here at all, with the reason when not: switched off by
`NIB_CUDA_KERNELS=0`, a GPU below sm_80, no nvcc, a failed build or load.
"""

from __future__ import annotations

import logging
import os
import threading

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


def module(source: str, device: torch.device) -> driver.Module:
    """The loaded module of `source` (a file beside this package) on `device`."""
    index = _index(device)
    flags = trace_flags()
    key = (source, index, flags)
    with _lock:
        mod = _modules.get(key)
        if mod is None:
            cap = torch.cuda.get_device_capability(index)
            image = build.cubin(source, build.arch(cap), flags)
            mod = _modules[key] = driver.Module(image, torch.device("cuda", index), source)
        return mod


def loaded(device: torch.device, traced: bool = False) -> list[driver.Module]:
    """The modules loaded on `device` so far: the traced builds, or the plain ones."""
    index = _index(device)
    with _lock:
        return [m for (_, i, flags), m in _modules.items() if i == index and bool(flags) == traced]


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
