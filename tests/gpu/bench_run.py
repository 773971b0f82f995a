"""Run one bench/ script as a user would, and read the result file it writes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def run_bench(
    script: str, args: list[str], out: Path, name: str, timeout: float = 600
) -> dict[str, Any]:
    """`python3 bench/<script> <args> --out <out>` must exit 0 and write exactly one
    <date>-<name>.json, which starts with the common header; returns it."""
    cmd = [sys.executable, f"bench/{script}", *args, "--out", str(out)]
    proc = subprocess.run(
        cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (path,) = out.glob(f"*-{name}.json")
    result: dict[str, Any] = json.loads(path.read_text())
    assert list(result)[:4] == ["date", "device", "torch", "command"]
    return result
