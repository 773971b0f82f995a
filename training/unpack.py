"""Install a training run's output as the shipped model.

    python3 training/unpack.py DIR [--dest engine/assets/nib-tiny-code] [--force]

DIR holds what run_all.py wrote to $OUT (the safetensors shards and
nib-tiny-code-files.tar.gz). Every file's sha256 is checked against the run's
SHA256SUMS and the size rules (each file under 16 MiB, 32 MiB in all) before
anything is installed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from training.package import PackageError, unpack

DEFAULT_DEST = Path(__file__).resolve().parent.parent / "engine" / "assets" / "nib-tiny-code"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("src", type=Path, help="folder with the run's $OUT files")
    parser.add_argument("--dest", type=Path, default=DEFAULT_DEST)
    parser.add_argument("--force", action="store_true", help="replace an existing model folder")
    args = parser.parse_args(argv)
    try:
        files = unpack(args.src, args.dest, force=args.force)
    except PackageError as exc:
        print(f"unpack: {exc}", file=sys.stderr)
        return 1
    total = sum(p.stat().st_size for p in files)
    for p in files:
        print(f"{p.stat().st_size:>12,}  {p}")
    print(
        f"installed {len(files)} files, {total / 2**20:.2f} MiB, checksums verified, in {args.dest}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
