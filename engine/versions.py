"""What this server is built from and runs on: versions, the GPU, the kernels' identity.

Reported in model-info, the health detail and the start-up log, so that an
operator can tell two deployments apart and match a problem to a build.

The compute-capability floor: nib's Triton kernels run bfloat16 arithmetic (the
default dtype of 16-bit models on a GPU) and fp16 tensor-core MMA with
async copies, which need Ampere, sm_80, or newer. Below it the engine refuses
to start, unless `--allow-reference-fallback` asks for the (slow) PyTorch
reference path instead.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import platform
from dataclasses import dataclass, replace
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import torch

log = logging.getLogger("nib.engine")

MIN_COMPUTE_CAPABILITY = (8, 0)

_ENGINE = Path(__file__).resolve().parent
# Everything that decides what the GPU kernels compute or how they are launched.
KERNEL_SOURCES = (
    "kernels/*.py",
    "quant/kernels.py",
    "quant/layout.py",
    "quant/triton_*.py",
    "quant/tuned.json",
    "ops.py",
    "device_sampling.py",
    "cuda/*.cu",
    "cuda/*.cuh",
    "cuda/*.py",
)


class UnsupportedDevice(RuntimeError):
    """The GPU cannot run nib's kernels (and the reference fallback was not allowed)."""


def package_version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return ""


def nib_version() -> str:
    return package_version("nib") or "0+unknown"


@cache
def kernels_build_id() -> str:
    """A short hash of the kernel sources and tuned tables, and the Triton that compiles
    them: two servers with the same id run the same kernels."""
    digest = hashlib.sha256()
    files = sorted({p for pattern in KERNEL_SOURCES for p in _ENGINE.glob(pattern)})
    for path in files:
        digest.update(path.relative_to(_ENGINE).as_posix().encode())
        digest.update(b"\0")
        digest.update(path.read_bytes())
    triton = package_version("triton") or "none"
    return f"src-{digest.hexdigest()[:12]} triton-{triton}"


@dataclass(frozen=True)
class Versions:
    nib: str
    python: str
    torch: str
    cuda_runtime: str = ""  # the CUDA that torch was built with; "" on a CPU build
    cuda_driver: str = ""  # the CUDA version the installed driver supports
    nvidia_driver: str = ""  # e.g. "580.159"; "" without NVML
    triton: str = ""
    gpu: str = ""  # "" on the CPU
    compute_capability: str = ""  # e.g. "9.0"
    min_compute_capability: str = ""  # what the kernels need, on a GPU
    kernels_build: str = ""


def _cuda_driver_version() -> str:
    """The CUDA driver API version (cuDriverGetVersion), e.g. "13.0"."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        out = ctypes.c_int()
        if lib.cuDriverGetVersion(ctypes.byref(out)) != 0:
            return ""
    except (OSError, AttributeError):
        return ""
    return f"{out.value // 1000}.{out.value % 1000 // 10}"


def _nvidia_driver_version() -> str:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            driver: str = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no nvidia-ml-py, or NVML cannot start (no driver): unknown
        return ""
    return driver


def collect_versions(device: torch.device) -> Versions:
    """Versions for an engine on `device`; the GPU fields are filled only for CUDA."""
    base = Versions(
        nib=nib_version(),
        python=platform.python_version(),
        torch=torch.__version__,
        cuda_runtime=torch.version.cuda or "",
        triton=package_version("triton"),
    )
    if device.type != "cuda":
        return base
    props = torch.cuda.get_device_properties(device)
    floor = MIN_COMPUTE_CAPABILITY
    return replace(
        base,
        cuda_driver=_cuda_driver_version(),
        nvidia_driver=_nvidia_driver_version(),
        gpu=props.name,
        compute_capability=f"{props.major}.{props.minor}",
        min_compute_capability=f"{floor[0]}.{floor[1]}",
        kernels_build=kernels_build_id(),
    )


def kernels_supported(
    capability: tuple[int, int], gpu: str, *, allow_reference_fallback: bool
) -> bool:
    """True if the kernels can run on this GPU; False if the reference path must (and
    may) be used instead; UnsupportedDevice if it may not."""
    if capability >= MIN_COMPUTE_CAPABILITY:
        return True
    have = f"{capability[0]}.{capability[1]}"
    need = f"{MIN_COMPUTE_CAPABILITY[0]}.{MIN_COMPUTE_CAPABILITY[1]}"
    if not allow_reference_fallback:
        raise UnsupportedDevice(
            f"GPU {gpu} has compute capability {have}; nib's kernels need {need} or newer "
            "(bfloat16 and tensor-core paths). Start with --allow-reference-fallback to run "
            "the much slower PyTorch reference path on it instead."
        )
    log.warning(
        "GPU %s has compute capability %s < %s: running the PyTorch reference path "
        "(--allow-reference-fallback); no Triton kernels, no CUDA graphs",
        gpu,
        have,
        need,
    )
    return False
