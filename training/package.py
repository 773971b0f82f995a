"""Moving the model folder off the GPU host and into the repository.

The GPU host returns at most 8 files of at most 16 MiB each from $OUT. pack()
writes each safetensors shard as its own file plus one tar.gz of everything
small; unpack() (training/unpack.py) puts them back together, checks every
checksum and the size rules, and installs the folder.
"""

from __future__ import annotations

import hashlib
import shutil
import tarfile
import tempfile
from pathlib import Path

MIB = 1024 * 1024
MAX_FILE = 16 * MIB  # each shipped file is smaller than this
MAX_TOTAL = 32 * MIB  # the whole shipped folder is at most this
MAX_RETURNED_FILES = 8
TAR_NAME = "nib-tiny-code-files.tar.gz"
SUMS = "SHA256SUMS"


class PackageError(RuntimeError):
    """A folder or archive that breaks a size rule or a checksum, naming the file."""


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_sums(folder: Path) -> Path:
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.name != SUMS)
    lines = [f"{sha256_file(p)}  {p.name}\n" for p in files]
    (folder / SUMS).write_text("".join(lines))
    return folder / SUMS


def verify_sums(folder: Path) -> None:
    listed = set()
    for line in (folder / SUMS).read_text().splitlines():
        digest, name = line.split(maxsplit=1)
        listed.add(name)
        path = folder / name
        if not path.is_file():
            raise PackageError(f"{name} is listed in {SUMS} but missing")
        if sha256_file(path) != digest:
            raise PackageError(f"{name}: sha256 does not match {SUMS}")
    extra = sorted(p.name for p in folder.iterdir() if p.name not in listed | {SUMS})
    if extra:
        raise PackageError(f"{extra[0]} is not listed in {SUMS}")


def check_limits(folder: Path) -> int:
    """Total bytes of the folder; PackageError if a file or the total is too big."""
    total = 0
    for p in sorted(folder.iterdir()):
        if not p.is_file():
            raise PackageError(f"{p.name}: the model folder must hold only plain files")
        size = p.stat().st_size
        if size >= MAX_FILE:
            raise PackageError(f"{p.name} is {size / MIB:.2f} MiB; each file must be under 16 MiB")
        total += size
    if total > MAX_TOTAL:
        raise PackageError(f"the model folder is {total / MIB:.2f} MiB; at most 32 MiB may ship")
    return total


def pack(model_dir: Path, out: Path, extra: list[Path] | None = None) -> list[Path]:
    """Shards as separate files, everything else in one tar.gz; returns what was written."""
    write_sums(model_dir)
    out.mkdir(parents=True, exist_ok=True)
    shards = sorted(model_dir.glob("*.safetensors"))
    if len(shards) + 1 + len(extra or []) > MAX_RETURNED_FILES:
        raise PackageError(f"{len(shards)} shards leave no room in the {MAX_RETURNED_FILES} files")
    written = []
    for shard in shards:
        shutil.copyfile(shard, out / shard.name)
        written.append(out / shard.name)
    with tarfile.open(out / TAR_NAME, "w:gz") as tar:
        for p in sorted(model_dir.iterdir()):
            if p.suffix != ".safetensors":
                tar.add(p, arcname=p.name)
    if (out / TAR_NAME).stat().st_size >= MAX_FILE:
        raise PackageError(f"{TAR_NAME} is over 16 MiB")
    written.append(out / TAR_NAME)
    for p in extra or []:
        shutil.copyfile(p, out / p.name)
        written.append(out / p.name)
    check_limits(model_dir)  # after writing: a run over the limits still returns its files
    return written


def unpack(src: Path, dest: Path, force: bool = False) -> list[Path]:
    """Rebuild the model folder from pack()'s files under `src` and install it at `dest`."""
    tars = sorted(src.rglob(TAR_NAME))
    if len(tars) != 1:
        raise PackageError(f"expected one {TAR_NAME} under {src}, found {len(tars)}")
    if dest.exists() and not force:
        raise PackageError(f"{dest} exists; pass --force to replace it")
    with tempfile.TemporaryDirectory() as tmp:
        staged = Path(tmp) / "model"
        staged.mkdir()
        with tarfile.open(tars[0], "r:gz") as tar:
            tar.extractall(staged, filter="data")
        for shard in sorted(tars[0].parent.glob("*.safetensors")):
            shutil.copyfile(shard, staged / shard.name)
        verify_sums(staged)
        check_limits(staged)
        if dest.exists():
            shutil.rmtree(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(staged, dest)
    return sorted(dest.iterdir())
