"""Where the corpus comes from: the running interpreter's standard library and the
`.py` files of the distributions installed in its site-packages.

Every file belongs to a *unit*, the thing the held-out split chooses: a top-level
module, or a package's first-level sub-package (`torch/nn`, `numpy/linalg`,
`json`). A unit's tests stay with it: inside packages they live under the package
already; the standard library's `test/test_json/` and `test/test_os.py` are
mapped to the units `json` and `os`.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import posixpath
import re
import site
import sys
import sysconfig
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from training.licenses import LicenseVerdict, classify

STDLIB = "stdlib"
# lib2to3 carries Python 2 test data; ensurepip only bundles wheels.
TEST_DIR = re.compile(r"^(test|tests|testing|_tests?|.+_tests?)$")
_STDLIB_SKIP = {"site-packages", "dist-packages", "__pycache__", "lib2to3", "ensurepip"}


@dataclass(frozen=True)
class Source:
    """A distribution (or the standard library) and its licence verdict."""

    name: str
    version: str
    verdict: LicenseVerdict
    root: Path  # the folder its relative paths start from


@dataclass(frozen=True)
class SourceFile:
    source: str
    unit: str  # "<source>:<unit path>", e.g. "torch:torch/nn", "stdlib:json"
    relpath: str  # path inside the source's root, "/"-separated
    path: Path


def site_packages_dirs() -> list[Path]:
    """The interpreter's site-packages folders (sysconfig first, then site), de-duplicated."""
    paths = sysconfig.get_paths()
    found = [paths["purelib"], paths["platlib"]]
    found += site.getsitepackages() if hasattr(site, "getsitepackages") else []
    if site.ENABLE_USER_SITE:
        found.append(site.getusersitepackages())
    out: list[Path] = []
    for p in found:
        resolved = Path(p).resolve()
        if resolved.is_dir() and resolved not in out:
            out.append(resolved)
    return out


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"]).resolve()


def is_test_dir(name: str) -> bool:
    return TEST_DIR.match(name) is not None


def unit_of(relpath: str) -> str:
    """The held-out unit of a path: module `x.py` -> x, `pkg/a.py` -> pkg, `pkg/sub/..` -> pkg/sub;
    a package's own test folder (`pkg/tests/..`) belongs to the package."""
    parts = relpath.split("/")
    if len(parts) == 1:
        return parts[0].removesuffix(".py")
    if len(parts) == 2 or is_test_dir(parts[1]):
        return parts[0]
    return f"{parts[0]}/{parts[1]}"


def stdlib_unit_of(relpath: str, top_level: set[str]) -> str:
    """Like unit_of, but the test suite's `test/test_<name>[.py|/]` belongs to unit <name>."""
    parts = relpath.split("/")
    if parts[0] == "test" and len(parts) >= 2:
        m = re.match(r"test_([A-Za-z0-9_]+?)(\.py)?$", parts[1])
        if m and m.group(1) in top_level:
            return m.group(1)
        return "test"
    return unit_of(relpath)


def _walk_py(root: Path, skip: set[str]) -> Iterator[str]:
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in skip and not d.startswith("."))
        rel = Path(dirpath).relative_to(root)
        for name in sorted(filenames):
            if name.endswith(".py"):
                yield (rel / name).as_posix()


def stdlib_files(version: str | None = None) -> tuple[Source, list[SourceFile]]:
    root = stdlib_dir()
    version = version or ".".join(map(str, sys.version_info[:3]))
    verdict = LicenseVerdict(True, "PSF-2.0", "Python standard library")
    rels = list(_walk_py(root, _STDLIB_SKIP))
    top = {unit_of(r) for r in rels if "/" not in unit_of(r)}
    files = [SourceFile(STDLIB, f"{STDLIB}:{stdlib_unit_of(r, top)}", r, root / r) for r in rels]
    return Source(STDLIB, version, verdict, root), files


def _dist_name(dist: md.Distribution) -> str:
    return re.sub(r"[-_.]+", "-", (dist.metadata["Name"] or "unknown")).lower()


def distributions() -> Iterator[tuple[md.Distribution, Path]]:
    """Installed distributions, one per normalised name (the first site dir wins)."""
    seen: set[str] = set()
    for sp in site_packages_dirs():
        for dist in sorted(md.distributions(path=[str(sp)]), key=_dist_name):
            name = _dist_name(dist)
            if name not in seen:
                seen.add(name)
                yield dist, sp


def distribution_files(dist: md.Distribution, site_dir: Path) -> tuple[Source, list[SourceFile]]:
    meta = dist.metadata
    verdict = classify(
        meta.get("License-Expression"), meta.get_all("Classifier") or [], meta.get("License")
    )
    name = _dist_name(dist)
    files: list[SourceFile] = []
    base = Path(str(dist.locate_file("")))
    for f in dist.files or []:
        # RECORD paths are relative to site-packages; plain string work, as there are thousands.
        rel = posixpath.normpath(str(f).replace(os.sep, "/"))
        if not rel.endswith(".py") or rel.startswith("../") or rel.startswith("/"):
            continue  # not Python, or a script installed outside site-packages
        if "__pycache__" in rel:
            continue
        files.append(SourceFile(name, f"{name}:{unit_of(rel)}", rel, base / rel))
    files.sort(key=lambda s: s.relpath)
    # A top-level test package shipped by a distribution tests its main package: the
    # top-level folder with the most files.
    tops = Counter(f.relpath.split("/")[0] for f in files if "/" in f.relpath)
    main = [t for t in sorted(tops, key=lambda t: (-tops[t], t)) if not is_test_dir(t)]
    if main:
        files = [
            replace(f, unit=f"{name}:{main[0]}") if is_test_dir(f.relpath.split("/")[0]) else f
            for f in files
        ]
    return Source(name, meta["Version"] or "", verdict, site_dir), files


def all_sources() -> list[tuple[Source, list[SourceFile]]]:
    """The standard library, then every installed distribution (licence not yet applied)."""
    out = [stdlib_files()]
    out += [distribution_files(dist, sp) for dist, sp in distributions()]
    return out
