"""Shared by the benchmarks: the copy-bandwidth ceiling, device naming, result files, README tables."""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
import sys
from pathlib import Path
from typing import Any

# torch is imported where a function needs it: bench/targets.py writes its README table
# through this module on machines without torch.

README = Path(__file__).resolve().parent / "README.md"


def copy_bandwidth_gbps(nbytes: int = 2 << 30, iters: int = 20) -> float:
    """Median device-to-device copy bandwidth, counting bytes read + written."""
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    src.random_()
    dst = torch.empty_like(src)
    times = []
    for _ in range(iters + 3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    del src, dst
    median = sorted(times[3:])[iters // 2]
    return 2 * nbytes / median / 1e9


def device_name() -> str:
    import torch

    props = torch.cuda.get_device_properties(0)
    return f"{props.name} ({props.multi_processor_count} SMs, {props.total_memory / 2**30:.0f} GiB)"


def cpu_name() -> str:
    """The CPU's model name and core count (from /proc/cpuinfo where there is one)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        name = next(
            line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")
        )
    except (OSError, StopIteration):
        name = platform.machine()
    return f"{name}, {os.cpu_count()} cores"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[int(q * (len(ordered) - 1))]


def write_result(
    out: Path,
    name: str,
    script: str,
    fields: dict[str, Any],
    indent: int = 2,
    device: str | None = None,
) -> Path:
    """out/<date>-<name>.json: date, device (the GPU's name unless `device` says what
    else ran it, e.g. cpu_name()), torch and the command (`python3 bench/<script>` with
    this process's arguments) first, then `fields`. Returns the path."""
    import torch

    date = datetime.date.today().isoformat()
    result = {
        "date": date,
        "device": device if device is not None else device_name(),
        "torch": torch.__version__,
        "command": "python3 " + " ".join([f"bench/{script}", *sys.argv[1:]]),
        **fields,
    }
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{date}-{name}.json"
    path.write_text(json.dumps(result, indent=indent) + "\n")
    print(f"wrote {path}")
    return path


def write_readme_table(section: str, caption: str, lines: list[str]) -> None:
    """Replace the table between <!-- BEGIN section --> and <!-- END section -->."""
    text = README.read_text() if README.exists() else "# Benchmarks\n"
    block = (
        f"<!-- BEGIN {section} -->\n{caption}\n\n" + "\n".join(lines) + f"\n<!-- END {section} -->"
    )
    pattern = re.compile(rf"<!-- BEGIN {section} -->.*?<!-- END {section} -->", re.S)
    text = (
        pattern.sub(block, text) if pattern.search(text) else text.rstrip() + "\n\n" + block + "\n"
    )
    README.write_text(text)
