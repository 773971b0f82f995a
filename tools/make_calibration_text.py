"""Rebuild engine/quant/calibration/ from the local CPython standard library.

The calibration text (for GPTQ) and the held-out text (for the INT4 perplexity
check) are plain concatenations of CPython stdlib modules, which the Python
Software Foundation License permits redistributing. PROVENANCE.md records the
Python version, the files and their SHA-256, so the text can be re-derived.
"""

from __future__ import annotations

import hashlib
import sys
import sysconfig
from pathlib import Path

CALIBRATION = (
    "textwrap.py", "heapq.py", "fractions.py", "statistics.py", "dataclasses.py",
    "functools.py", "shlex.py", "string.py", "calendar.py", "fnmatch.py", "glob.py", "csv.py",
)  # fmt: skip
HELD_OUT = ("graphlib.py", "bisect.py", "colorsys.py")
SEPARATOR = "\n# ---- file: {name} ----\n"


def build(out_dir: Path) -> None:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    lines = [
        "# Calibration and held-out text: provenance",
        "",
        f"Made by `tools/make_calibration_text.py` from the CPython {sys.version.split()[0]} "
        "standard library (`Lib/`), distributed under the Python Software Foundation License "
        "Version 2 (https://docs.python.org/3/license.html), which permits redistribution with "
        "the copyright notice: Copyright (c) 2001 Python Software Foundation; All Rights Reserved.",
        "",
        "The two files share no source file. `python-stdlib-calibration.txt` calibrates GPTQ "
        "(`nib quantize`); `python-stdlib-heldout.txt` measures INT4 vs 16-bit perplexity.",
        "",
        "| output | source file | sha256 |",
        "|---|---|---|",
    ]
    for out_name, names in (
        ("python-stdlib-calibration.txt", CALIBRATION),
        ("python-stdlib-heldout.txt", HELD_OUT),
    ):
        parts = []
        for name in names:
            data = (stdlib / name).read_bytes()
            lines.append(f"| {out_name} | Lib/{name} | {hashlib.sha256(data).hexdigest()} |")
            parts.append(SEPARATOR.format(name=name) + data.decode("utf-8"))
        (out_dir / out_name).write_text("".join(parts), encoding="utf-8")
    (out_dir / "PROVENANCE.md").write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    build(Path(__file__).resolve().parent.parent / "engine" / "quant" / "calibration")
