"""Where nib stands against issues 4, 5 and 6's targets, read from the committed results.

    python3 bench/targets.py                    # the newest H200 result of each target
    python3 bench/targets.py --device H100      # another card's results, same (H200) limits
    python3 bench/targets.py --json t.json --fail-on-miss

Measures nothing: it reads bench/results/<date>-<kind>[-suffix].json, as written by
bench/decode.py (issues 4 and 6), bench/int4_linear.py (issue 5), bench/wire.py and
bench/stability.py (issue 6), and takes each target from the newest file that measured it
on the card asked for (`--device`, a substring; experiment files are left out), so a run of
one shape leaves the other shape's figures standing. Every target is printed with its
limit, the measured value, met or missed, and the file it came from. A target no such file
measured is "not measured", which --fail-on-miss counts as a miss.
The speed limits are the issues' and are H200 figures: another card's results are printed
against them, never as meeting them. The stability run is a pass or fail the issue asks
of the GPU, so its newest result from any GPU is judged, naming the card. `--readme`
writes the table into bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from wire import MAX_CANCEL_STEPS, MAX_EXTRA_INTER_TOKEN_MS, MAX_TTFT_DIFF_MS  # noqa: E402

RESULTS = ROOT / "bench" / "results"
CARD = "H200"  # the card the issues' limits were set on
Result = dict[str, Any]
LAYER = ("qkv", "o_proj", "gate_up", "down")


@dataclass(frozen=True)
class Target:
    issue: int
    kind: str  # the result file's kind: decode, int4-linear, wire, stability
    what: str
    limit: float
    unit: str
    value: Callable[[Result], float | None]  # None: the result does not have it
    any_gpu: bool = False  # a pass/fail the issue asks of any GPU, not an H200 figure


@dataclass(frozen=True)
class Standing:
    target: Target
    value: float | None
    source: str  # the result file's name, "" when there is none
    card: str = CARD  # the card asked for
    device: str = ""  # the device the result file names

    @property
    def verdict(self) -> str:
        if self.value is None:
            return "not measured"
        within = self.value <= self.target.limit
        if self.card.lower() != CARD.lower() and not self.target.any_gpu:  # an H200 figure
            return f"{'within' if within else 'over'} the limit ({self.card})"
        return "met" if within else "missed"


def decode_row(result: Result, shape: str, impl: str, context: int) -> Result | None:
    return next(
        (
            r
            for r in result.get("rows", [])
            if (r["shape"], r["impl"], r["context"]) == (shape, impl, context)
        ),
        None,
    )


def decode(shape: str, impl: str, key: str, context: int = 640) -> Callable[[Result], float | None]:
    def value(result: Result) -> float | None:
        row = decode_row(result, shape, impl, context)
        return None if row is None else float(row[key])

    return value


def over_floor(shape: str, impl: str, context: int) -> Callable[[Result], float | None]:
    def value(result: Result) -> float | None:
        row = decode_row(result, shape, impl, context)
        return None if row is None else float(row["ms_per_token_median"]) / float(row["floor_ms"])

    return value


def linear_us(
    result: Result, layers: Iterable[str], m: int, impl: str = "nib-int4"
) -> float | None:
    """The summed median µs of these linears at M rows (None if one is missing)."""
    us = {(r["layer"], r["m"], r["impl"]): r["us_median"] for r in result.get("rows", [])}
    found = [us.get((layer, m, impl)) for layer in layers]
    return None if any(x is None for x in found) else float(sum(found))  # type: ignore[arg-type]


def layer(model: str) -> list[str]:
    return [f"{model}.{name}" for name in LAYER]


def linears(layers: list[str], m: int) -> Callable[[Result], float | None]:
    return lambda result: linear_us(result, layers, m)


def wire_row(result: Result, shape: str) -> Result | None:
    """Issue 6's wire row of this shape: INT4 weights, no spinners."""
    return next(
        (
            r
            for r in result.get("rows", [])
            if r["shape"] == shape and "--quant=int4" in r["serve_args"] and not r.get("spin")
        ),
        None,
    )


def wire(shape: str, figure: str, path: str) -> Callable[[Result], float | None]:
    """figure: inter-token (client - engine), ttft (|client - engine|) or cancel (overrun
    steps, worst); path: "" (Complete) or "session_"."""

    def value(result: Result) -> float | None:
        row = wire_row(result, shape)
        if row is None:
            return None
        if figure == "cancel":
            return float(row["cancel_overrun_steps_max"])
        name = {"inter-token": "inter_token_ms_median", "ttft": "ttft_ms_median"}[figure]
        gap = float(row[f"{path}client_{name}"]) - float(row[f"{path}engine_{name}"])
        return abs(gap) if figure == "ttft" else gap

    return value


def stability(shape: str) -> Callable[[Result], float | None]:
    """1 if the INT4 row of this shape failed, 0 if it passed the issue's full run."""

    def value(result: Result) -> float | None:
        row = next(
            (
                r
                for r in result.get("rows", [])
                if r["shape"] == shape
                and r.get("quant") == "int4"
                and r["decode_steps"] >= 10_000
                and r["requests"] >= 1_000
            ),
            None,
        )
        return None if row is None else float(not row["passed"])

    return value


SEVEN, QWEN = "llama-2-7b", "qwen2.5-coder-1.5b"
# Issue 5's: (what, the linears summed, M, limit in µs); bench/int4_linear.py prints them too.
ISSUE_5 = [
    ("one Llama-2-7B layer's four linears, M=1", layer(SEVEN), 1, 32.0),
    ("one Llama-2-7B layer's four linears, M=16", layer(SEVEN), 16, 40.0),
    ("one Qwen2.5-1.5B layer's four linears, M=1", layer(QWEN), 1, 12.0),
    ("Llama-2-7B lm_head, M=1", [f"{SEVEN}.lm_head"], 1, 20.0),
]
TARGETS = [
    Target(4, "decode", "Llama-2-7B bf16 decode, context 640", 3.6, "ms/token", decode(SEVEN, "nib-graphs", "ms_per_token_median")),
    Target(4, "decode", "Qwen2.5-1.5B bf16 decode, context 640", 0.85, "ms/token", decode(QWEN, "nib-graphs", "ms_per_token_median")),
    Target(4, "decode", "Llama-2-7B bf16 time to first token, 512-token prompt", 15, "ms", decode(SEVEN, "nib-graphs", "ttft_ms")),
    Target(4, "decode", "Qwen2.5-1.5B bf16 time to first token, 512-token prompt", 5, "ms", decode(QWEN, "nib-graphs", "ttft_ms")),
    *[Target(5, "int4-linear", f"INT4 kernels: {what}", limit, "µs", linears(names, m)) for what, names, m, limit in ISSUE_5],
    Target(6, "decode", "Llama-2-7B INT4 decode, context 640", 1.15, "ms/token", decode(SEVEN, "nib-int4-graphs", "ms_per_token_median")),
    Target(6, "decode", "Llama-2-7B INT4 decode at 4K context, over its floor", 1.3, "x floor", over_floor(SEVEN, "nib-int4-graphs", 4096)),
    Target(6, "decode", "Qwen2.5-1.5B INT4 decode, context 640", 0.40, "ms/token", decode(QWEN, "nib-int4-graphs", "ms_per_token_median")),
    Target(6, "decode", "Llama-2-7B INT4 time to first token, 512-token prompt", 20, "ms", decode(SEVEN, "nib-int4-graphs", "ttft_ms")),
    Target(6, "decode", "Qwen2.5-1.5B INT4 time to first token, 512-token prompt", 6, "ms", decode(QWEN, "nib-int4-graphs", "ttft_ms")),
    *[
        Target(6, "wire", f"{name} INT4 {what}, {label}", limit, unit, wire(shape, figure, path))
        for shape, name in ((SEVEN, "Llama-2-7B"), (QWEN, "Qwen2.5-1.5B"))
        for figure, what, limit, unit in (
            ("inter-token", "client inter-token over the engine's", MAX_EXTRA_INTER_TOKEN_MS, "ms"),
            ("ttft", "client time to first token off the engine's", MAX_TTFT_DIFF_MS, "ms"),
        )
        for path, label in (("", "Complete"), ("session_", "Session"))
    ],
    *[
        Target(6, "wire", f"{name} INT4 steps after a cancel (Session)", MAX_CANCEL_STEPS, "steps", wire(shape, "cancel", ""))
        for shape, name in ((SEVEN, "Llama-2-7B"), (QWEN, "Qwen2.5-1.5B"))
    ],
    *[
        Target(6, "stability", f"{name} INT4: 10,000 steps and 1,000 requests, rows failed", 0, "failed", stability(shape), any_gpu=True)
        for shape, name in ((SEVEN, "Llama-2-7B"), (QWEN, "Qwen2.5-1.5B"))
    ],
]  # fmt: skip


def result_device(result: Result) -> str:
    return str(result.get("device") or result.get("gpu") or "")


def candidates(
    results: Path, kind: str, card: str, any_gpu: bool = False
) -> list[tuple[str, Result]]:
    """The <date>-<kind>[-suffix].json files measured on `card` (any_gpu: on any device
    but the CPU), newest first: by date, then by when git committed them."""
    pattern = re.compile(rf"^\d{{4}}-\d\d-\d\d-{re.escape(kind)}(-[a-z0-9.-]+)?\.json$")
    found = []
    for path in results.glob(f"*-{kind}*.json"):
        if not pattern.match(path.name) or "experiment" in path.name:
            continue
        result = json.loads(path.read_text())
        device = result_device(result).lower()
        if (device not in ("", "cpu")) if any_gpu else (card.lower() in device):
            found.append((path.name[:10], committed(path), path.name, result))
    found.sort(reverse=True, key=lambda f: f[:3])
    return [(name, result) for _, _, name, result in found]


def newest(results: Path, kind: str, card: str, any_gpu: bool = False) -> tuple[str, Result] | None:
    """The newest such file, or None."""
    found = candidates(results, kind, card, any_gpu)
    return found[0] if found else None


def committed(path: Path) -> int:
    """When git last committed this file (seconds), to order a day's files, whose names
    hold only the date. A file git does not know (or no git at all) counts as the newest."""
    try:
        out = subprocess.run(
            ["git", "log", "-1", "--format=%ct", "--", path.name],
            cwd=path.parent,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        out = ""
    return int(out) if out else 1 << 62


def standings(results: Path = RESULTS, card: str = CARD) -> list[Standing]:
    """Each target from the newest file that measured it: a run of one shape or one impl
    (STABILITY_SHAPES, DECODE_IMPLS) leaves the others' newest figures standing. A target
    no file measured is "not measured", naming the newest file of its kind."""
    wanted = {(t.kind, t.any_gpu) for t in TARGETS}
    files = {(kind, gpu): candidates(results, kind, card, gpu) for kind, gpu in wanted}
    out = []
    for target in TARGETS:
        found = files[target.kind, target.any_gpu]
        hit = next(((n, r, v) for n, r in found if (v := target.value(r)) is not None), None)
        name, result, value = hit or ((*found[0], None) if found else ("", {}, None))
        out.append(Standing(target, value, name, card, result_device(result)))
    return out


def number(x: float) -> str:
    return f"{x:.3f}".rstrip("0").rstrip(".") if x != int(x) else f"{int(x)}"


def table(rows: list[Standing]) -> list[str]:
    lines = [
        "| issue | target | limit | measured | verdict | result file |",
        "|---:|---|---:|---:|---|---|",
    ]
    for s in rows:
        t = s.target
        measured = "" if s.value is None else f"{number(round(s.value, 3))} {t.unit}"
        source = f"`{s.source}`" if s.source else ""
        if s.source and t.any_gpu:  # say which GPU it ran on
            source += f" ({s.device.split(' (')[0]})"
        lines.append(
            f"| {t.issue} | {t.what} | {number(t.limit)} {t.unit} | {measured} | {s.verdict} | {source} |"
        )
    return lines


def caption(card: str) -> str:
    return (
        f"The issues' targets (H200 figures) against the newest {card} result that measured each, in "
        f"`results/`: `python3 bench/targets.py{'' if card == CARD else ' --device ' + card}`"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default=CARD, help="a substring of the results' device")
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--json", type=Path, help="also write the standings here")
    parser.add_argument(
        "--readme", action="store_true", help="write the table into bench/README.md"
    )
    parser.add_argument(
        "--fail-on-miss", action="store_true", help="exit 1 if a target is missed or not measured"
    )
    args = parser.parse_args(argv)
    rows = standings(args.results, args.device)
    lines = table(rows)
    print(caption(args.device) + "\n")
    print("\n".join(lines))
    counts = Counter(s.verdict for s in rows)
    print("\n" + ", ".join(f"{n} {v}" for v, n in counts.items()))
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "device": args.device,
                    "rows": [
                        {
                            "issue": s.target.issue,
                            "target": s.target.what,
                            "limit": s.target.limit,
                            "unit": s.target.unit,
                            "value": s.value,
                            "verdict": s.verdict,
                            "source": s.source,
                        }
                        for s in rows
                    ],
                },
                indent=1,
            )
            + "\n"
        )
    if args.readme:
        from common import write_readme_table

        write_readme_table("targets", caption(args.device), lines)
    return 1 if args.fail_on_miss and counts["met"] < len(rows) else 0


if __name__ == "__main__":
    sys.exit(main())
