"""bench/README.md's decode tables hold exactly what bench/decode.py makes of the committed
results (the numbers in the README are the JSON's, not typed in), and the profile table
lists each row at the position it was profiled at (rows from before that was recorded,
all profiled at one position: one per path). The top README's summary table, typed by
hand, is checked against the newest result too, so a new run cannot leave it behind."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "bench" / "README.md"
TOP_README = ROOT / "README.md"


@pytest.fixture(scope="module")
def decode() -> ModuleType:
    sys.path.insert(0, str(ROOT / "bench"))
    spec = importlib.util.spec_from_file_location("decode_bench", ROOT / "bench" / "decode.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def block(section: str) -> list[str]:
    text = README.read_text()
    m = re.search(rf"<!-- BEGIN {section} -->\n(.*?)\n<!-- END {section} -->", text, re.S)
    assert m, f"no {section} block in bench/README.md"
    return m.group(1).split("\n")


def latest() -> dict:  # type: ignore[type-arg]
    names = sorted(p.name for p in (ROOT / "bench" / "results").glob("*-decode.json"))
    return json.loads((ROOT / "bench" / "results" / names[-1]).read_text())


def test_the_readme_tables_are_the_results(decode: ModuleType) -> None:
    result = latest()
    before = json.loads(decode.BEFORE.read_text())
    lines = block("decode")
    assert lines[0] == decode.readme_caption(result)
    assert lines[2:] == decode.readme_table(result)
    lines = block("decode-profile")
    assert lines[0] == decode.profile_caption(result, before)
    assert lines[2:] == decode.profile_table(result, before)


# The top README's decode table: its label of each row and the (impl, context) it shows.
TOP_ROWS = {
    "nib, bf16, graphs (ms/token)": ("nib-graphs", 640),
    "nib, INT4 RTN, graphs": ("nib-int4-graphs", 640),
    "nib, INT4, 4K context": ("nib-int4-graphs", 4096),
    "PyTorch INT4 (tinygemm) under torch.compile, our model code": ("torch-int4-compile", 640),
    "transformers, static cache + torch.compile": ("hf-static-compile", 640),
    "transformers eager": ("hf-eager", 640),
}
SHAPES = ("llama-2-7b", "qwen2.5-coder-1.5b")


def test_the_top_readme_table_is_the_newest_result() -> None:
    result = latest()
    text = TOP_README.read_text()
    cited = re.search(
        r"Measured on the lent H200 \(`bench/README.md`, `bench/results/([^`]+)`", text
    )
    assert cited, "README.md no longer names the decode result its table comes from"
    assert f"{result['date']}-decode.json" == cited.group(1)
    rows = {(r["shape"], r["impl"], r["context"]): r for r in result["rows"]}
    table = re.search(r"^\|.*?\n(?!\|)", text[cited.end() :], re.M | re.S)  # the first table
    assert table, "no table after the sentence that names the result"
    cells = {m.group(1): [c.strip() for c in m.group(2).split("|")]
             for m in re.finditer(r"^\| ([^|]+?) \|(.+)\|$", table.group(0), re.M)}  # fmt: skip

    def ms(shape: str, impl: str, context: int) -> str:
        r = rows[(shape, impl, context)]
        digits = 2 if r["ms_per_token_median"] >= 10 else 3
        value = f"{r['ms_per_token_median']:.{digits}f}"
        return f"{value} (floor {r['floor_ms']:.2f})" if impl.startswith("nib") else value

    for label, (impl, context) in TOP_ROWS.items():
        assert cells[label] == [ms(s, impl, context) for s in SHAPES], label
    ttft = [" / ".join(f"{rows[(s, i, 640)]['ttft_ms']:.1f}" for i in ("nib-graphs", "nib-int4-graphs"))
            + " ms" for s in SHAPES]  # fmt: skip
    assert cells["nib time to first token, 512-token prompt, bf16 / INT4"] == ttft


def _row(shape: str, impl: str, context: int, kernels: float, total: float, replay: float):  # type: ignore[no-untyped-def]
    return {"shape": shape, "impl": impl, "context": context, "kernels_per_step": kernels,
            "kernel_sum_us": total, "graph_replay_us": replay}  # fmt: skip


def test_the_profile_table_keeps_one_row_per_path_of_unpositioned_profiles(
    decode: ModuleType,
) -> None:
    result = {
        "rows": [
            _row("llama-2-7b", "nib-graphs", 4096, 164, 4000.0, 3900.0),
            _row("llama-2-7b", "nib-graphs", 640, 164, 3781.0, 3528.0),
            {"shape": "llama-2-7b", "impl": "hf-eager", "context": 640},
        ]
    }
    before = {"rows": [_row("llama-2-7b", "nib-graphs", 640, 207, 4377.0, 4443.0)]}
    table = decode.profile_table(result, before)
    assert len(table) == 3  # header, rule, one row: the shortest context's
    assert table[2] == (
        "| llama-2-7b | nib-graphs | 640 | 300 | 164 | 3781 | 3528 | -253 | 207 | 4377 | 4443 |"
    )
    assert decode.profile_table(result)[2].endswith("| - | - | - |")


def test_the_profile_table_lists_every_positioned_row_at_its_position(decode: ModuleType) -> None:
    long, short = (_row("llama-2-7b", "nib-int4-graphs", c, 164, t, r)
                   for c, t, r in ((4096, 2200.0, 1950.0), (640, 1748.0, 1498.0)))  # fmt: skip
    long["profile_position"], short["profile_position"] = 4032, 576
    table = decode.profile_table({"rows": [long, short]})
    assert table[2:] == [
        "| llama-2-7b | nib-int4-graphs | 640 | 576 | 164 | 1748 | 1498 | -250 | - | - | - |",
        "| llama-2-7b | nib-int4-graphs | 4096 | 4032 | 164 | 2200 | 1950 | -250 | - | - | - |",
    ]


def _measured(shape: str, impl: str, context: int, run: str) -> dict[str, object]:
    return {"shape": shape, "impl": impl, "context": context, "run": run, "command": f"cmd {run}"}


def test_a_run_carries_the_newest_results_rows_it_does_not_measure_again(
    decode: ModuleType, tmp_path: Path
) -> None:
    old = [_measured("llama-2-7b", "hf-eager", 640, "2026-12-01T10:00"),
           _measured("llama-2-7b", "nib-int4-graphs", 640, "2026-12-01T11:00")]  # fmt: skip
    older = [_measured("llama-2-7b", "nib-eager", 640, "2026-11-30T10:00")]
    for day, rows in (("2026-11-30", older), ("2026-12-01", old), ("2026-12-03", older)):
        (tmp_path / f"{day}-decode.json").write_text(json.dumps({"device": "GPU", "rows": rows}))
    new = [_measured("llama-2-7b", "nib-int4-graphs", 640, "2026-12-02T09:00")]
    kept = decode.carried_rows(tmp_path, "2026-12-02", new, "GPU")
    # The newest file up to today, less the row this run measures again.
    assert kept == [old[0]]
    result = {"device": "GPU", "torch": "t", "date": "2026-12-02", "command": "cmd",
              "commands": ["cmd a", "cmd b"], "rows": kept + new}  # fmt: skip
    assert decode.readme_caption(result) == (
        "GPU, torch t, rows measured 2026-12-01, 2026-12-02; `cmd a`; `cmd b`"
    )
    assert decode.carried_rows(tmp_path / "none", "2026-12-02", new, "GPU") == []
    # Another card's rows stay in their own file: one file, one device.
    assert decode.carried_rows(tmp_path, "2026-12-02", new, "OTHER GPU") == []
