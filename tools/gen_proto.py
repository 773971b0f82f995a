"""Regenerate (or, with --check, verify) the committed gRPC stubs in proto/.

python tools/gen_proto.py           # rewrite proto/nib/v1/*_pb2*.py*
python tools/gen_proto.py --check   # exit 1 if they drifted from the .proto
"""

from __future__ import annotations

import argparse
import filecmp
import sys
import tempfile
from pathlib import Path

from protogen import PROTO_ROOT, generate_stubs


def generated_files(directory: Path) -> set[Path]:
    return {p.relative_to(directory) for p in directory.rglob("*_pb2*.py*")}


def drift(directory: Path = PROTO_ROOT) -> list[str]:
    """What differs between the stubs in `directory` and freshly generated ones."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp)
        generate_stubs(fresh)
        expected, committed = generated_files(fresh), generated_files(directory)
        problems = [f"missing or extra stub: {p}" for p in sorted(expected ^ committed)]
        problems += [
            f"stale stub: {p}"
            for p in sorted(expected & committed)
            if not filecmp.cmp(fresh / p, directory / p, shallow=False)
        ]
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="verify instead of rewriting")
    if not parser.parse_args().check:
        generate_stubs(PROTO_ROOT)
        return 0
    problems = drift()
    for line in problems:
        print(line, file=sys.stderr)
    if problems:
        print("generated stubs drifted from proto/: run `make proto`", file=sys.stderr)
        return 1
    print("generated stubs match proto/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
