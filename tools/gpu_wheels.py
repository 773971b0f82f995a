"""Fill .whl/ with the wheels a GPU run needs and the GPU host lacks.

The lent GPU host has python3 3.12 with torch, triton, transformers and the
scientific stack, and no network; tools/gpu_session.sh installs whatever lies in
.whl/ before it runs anything (README, "GPU runs"). This script decides what that
is, so a fresh checkout needs no list kept by hand:

    .venv/bin/python tools/gpu_wheels.py        # or: make gpu-wheels

It walks nib's runtime requirements (the base dependencies and the `server`
extra) as this interpreter's environment resolved them, stops at the packages the
host image already has (HOST_HAS), and downloads every other one at the version
installed here, as a wheel for CPython 3.12 on x86-64 Linux. Wheels of other
versions of the same packages are removed from .whl/: two versions of one
package stop the host's install.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import re
import subprocess
import sys
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
# Packages the GPU host's image provides (torch 2.11 with CUDA, and what it brings),
# used there at the host's own versions. A name here is neither carried nor walked.
HOST_HAS = frozenset(
    {
        "attrs",
        "nvidia-ml-py",
        "numpy",
        "prometheus-client",
        "safetensors",
        "tokenizers",
        "torch",
        "transformers",
        "triton",
        "typing-extensions",
    }
)
EXTRAS = ("server",)
PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
)


def _requirement_name(spec: str) -> tuple[str, str | None]:
    """(name, the extra it belongs to or None) of one Requires-Dist line."""
    req = Requirement(spec)
    extra = re.search(r"extra\s*==\s*['\"]([^'\"]+)['\"]", str(req.marker or ""))
    return canonicalize_name(req.name), extra.group(1) if extra else None


def _applies(spec: str) -> bool:
    """Whether a requirement's environment marker (other than `extra`) holds here."""
    marker = Requirement(spec).marker
    return marker is None or marker.evaluate({"extra": ""})


def to_carry(root: str = "nib", extras: tuple[str, ...] = EXTRAS) -> dict[str, str]:
    """{package: installed version} of what a GPU run needs beyond HOST_HAS."""
    carry: dict[str, str] = {}
    todo = []
    for spec in md.requires(root) or []:
        name, extra = _requirement_name(spec)
        if extra is None or extra in extras:
            todo.append(name)
    while todo:
        name = todo.pop()
        if name in HOST_HAS or name in carry:
            continue
        carry[name] = md.version(name)
        for spec in md.requires(name) or []:
            sub, extra = _requirement_name(spec)
            if extra is None and _applies(spec):
                todo.append(sub)
    return dict(sorted(carry.items()))


def _wheel_package(path: Path) -> str:
    return canonicalize_name(path.name.split("-", 1)[0])


def _fetch(carry: dict[str, str], dest: Path) -> int:
    """Download `carry` into dest, first removing other versions of those packages."""
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("*.whl"):
        if _wheel_package(old) in carry and f"-{carry[_wheel_package(old)]}-" not in old.name:
            old.unlink()  # another version of a carried package
    platforms = [a for p in PLATFORMS for a in ("--platform", p)]
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"]
    cmd += ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp"]
    cmd += [*platforms, "--dest", str(dest)]
    cmd += [f"{name}=={version}" for name, version in carry.items()]
    return subprocess.run(cmd, check=False).returncode


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dest", type=Path, default=ROOT / ".whl")
    ap.add_argument(
        "--list", action="store_true", help="print what would be carried, fetch nothing"
    )
    args = ap.parse_args(argv)
    carry = to_carry()
    if not args.list:
        done = _fetch(carry, args.dest)
        if done:
            return done
    for name, version in carry.items():
        print(f"{name}=={version}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
