"""Make the nib.* namespace importable from a plain checkout, without installing.

    PYTHONPATH=$(python3 tools/devtree.py) python3 -m pytest tests/gpu

Builds .devtree/nib/{v1,sdk,bridge,engine,service} as symlinks onto the
project's folders (the same mapping as pyproject.toml) and prints the folder to
put on PYTHONPATH. Used on the GPU host, where nothing is installed.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAPPING = {
    "v1": "proto/nib/v1",
    "sdk": "sdk",
    "bridge": "ide-extension-bridge",
    "engine": "engine",
    "service": "service",
}


def main() -> int:
    tree = ROOT / ".devtree"
    pkg = tree / "nib"
    pkg.mkdir(parents=True, exist_ok=True)
    for name, folder in MAPPING.items():
        link = pkg / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(ROOT / folder, target_is_directory=True)
    print(tree)
    return 0


if __name__ == "__main__":
    sys.exit(main())
