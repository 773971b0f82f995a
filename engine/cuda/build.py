"""Compiling nib's `.cu` files to cubins with nvcc, once per machine.

A cubin is cached under `$NIB_CUDA_CACHE` (default `~/.cache/nib/cuda`) by the
hash of everything that decides its bytes: the source and the headers beside
it, the architecture, the flags and the compiler's version line. A second
server start loads it without compiling. nvcc is found as `$NIB_NVCC`, on the
PATH, or under `$CUDA_HOME`; without it `CudaBuildError` says so and the
engine keeps its Triton kernels.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path

HERE = Path(__file__).resolve().parent
FLAGS = ("-O3", "-std=c++17", "--ptxas-options=-O3", "-lineinfo")


class CudaBuildError(RuntimeError):
    """nvcc is missing or rejected a source file (the message holds its output)."""


@cache
def nvcc() -> str:
    """The nvcc to use, or CudaBuildError naming where it was looked for."""
    candidates = [os.environ.get("NIB_NVCC"), shutil.which("nvcc")]
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            candidates.append(str(Path(home) / "bin" / "nvcc"))
    for c in candidates:
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return c
    raise CudaBuildError(
        "nvcc not found ($NIB_NVCC, PATH, $CUDA_HOME/bin, /usr/local/cuda/bin): "
        "install the CUDA toolkit to build nib's CUDA kernels"
    )


@cache
def nvcc_version() -> str:
    out = subprocess.run([nvcc(), "--version"], capture_output=True, text=True, check=False)
    lines = [line for line in out.stdout.splitlines() if line.strip()]
    return lines[-1] if lines else "unknown"


def arch(capability: tuple[int, int]) -> str:
    """sm_XY for a compute capability (X, Y)."""
    return f"sm_{capability[0]}{capability[1]}"


def cache_dir() -> Path:
    return Path(os.environ.get("NIB_CUDA_CACHE") or Path.home() / ".cache" / "nib" / "cuda")


def _digest(source: Path, target: str, flags: tuple[str, ...]) -> str:
    h = hashlib.sha256()
    for path in [source, *sorted(source.parent.glob("*.cuh"))]:
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    h.update("\0".join((target, *flags, nvcc_version())).encode())
    return h.hexdigest()[:16]


def _run_nvcc(source: Path, target: str, out: Path, extra: tuple[str, ...]) -> str:
    cmd = [nvcc(), "-cubin", f"-arch={target}", *FLAGS, *extra, f"-I{source.parent}"]
    cmd += ["-o", str(out), str(source)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise CudaBuildError(f"nvcc failed on {source.name} for {target}:\n{proc.stderr[-4000:]}")
    return proc.stderr


def cubin(source: Path | str, target: str, flags: tuple[str, ...] = ()) -> bytes:
    """The cubin of `source` (a path, or a file name beside this module) for `target`."""
    src = Path(source) if Path(source).is_absolute() else HERE / source
    key = _digest(src, target, flags)
    path = cache_dir() / f"{src.stem}-{target}-{key}.cubin"
    if path.is_file():
        return path.read_bytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        tmp_out = Path(tmp) / path.name
        _run_nvcc(src, target, tmp_out, flags)
        os.replace(tmp_out, path)  # atomic: concurrent builders never see half a file
    return path.read_bytes()


@dataclass(frozen=True)
class Resources:
    """What ptxas reports for one kernel."""

    kernel: str
    registers: int
    stack_bytes: int
    spill_stores: int
    spill_loads: int
    shared_bytes: int


_FUNC = re.compile(r"Compiling entry function '(\w+)'")
_STACK = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers(?:.*?(\d+) bytes smem)?")


@cache
def resources(
    source: Path | str, target: str, flags: tuple[str, ...] = ()
) -> tuple[Resources, ...]:
    """ptxas's resource report for every kernel of `source` (compiles once per process)."""
    src = Path(source) if Path(source).is_absolute() else HERE / source
    with tempfile.TemporaryDirectory() as tmp:
        log = _run_nvcc(src, target, Path(tmp) / "out.cubin", (*flags, "-Xptxas", "-v"))
    out: list[Resources] = []
    name, stack = "", (0, 0, 0)
    for line in log.splitlines():
        if m := _FUNC.search(line):
            name = m[1]
        elif m := _STACK.search(line):
            stack = (int(m[1]), int(m[2]), int(m[3]))
        elif (m := _USED.search(line)) and name:
            out.append(Resources(name, int(m[1]), *stack, int(m[2] or 0)))
            name, stack = "", (0, 0, 0)
    return tuple(out)
