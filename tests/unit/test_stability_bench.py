"""bench/stability.py: a small CPU run on the shipped model passes and its counts add up,
and the pass rule fails a row for each defect the issue names."""

from __future__ import annotations

import datetime as dt
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def stability() -> ModuleType:
    spec = importlib.util.spec_from_file_location("stability", ROOT / "bench" / "stability.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["stability"] = module
    spec.loader.exec_module(module)
    return module


def test_small_cpu_run_passes_and_accounts_for_every_request(
    stability: ModuleType, tmp_path: Path
) -> None:
    argv = ["--device", "cpu", "--steps", "64", "--requests", "20", "--max-new", "8"]
    rc = stability.main([*argv, "--warmup", "4", "--out", str(tmp_path)])
    (path,) = tmp_path.glob("*-stability.json")
    result = json.loads(path.read_text())
    assert result["command"].startswith("python3 bench/stability.py --device cpu")
    (row,) = result["rows"]
    assert row["passed"] and rc == 0, row["failures"]
    assert row["decode_steps"] == 64
    assert row["requests"] == 20
    ended = row["completed"] + row["cancelled"] + row["superseded"] + row["errors"]
    assert ended + row["lost"] == 20
    assert row["lost"] == row["duplicated"] == row["errors"] == 0
    assert row["planned"].get("cancel", 0) + row["planned"].get("supersede", 0) > 0
    assert row["cancelled"] + row["superseded"] > 0, "no request was interrupted"
    assert row["same_output_fixed_seed"] is True
    assert row["graph_fallbacks"] == 0
    assert row["memory_allocated_start"] is None and row["memory_reserved_end"] is None
    assert row["memory_requested_start"] is None


def passing_row() -> dict[str, Any]:
    return {
        "quant": "int4",
        "quant_asked": "int4",
        "quantization": "int4-g128-rtn",
        "graph_fallbacks": 0,
        "graphs_not_captured": [],
        "graphs_captured": 40,
        "lost": 0,
        "other_lost": 0,
        "duplicated": 0,
        "other_duplicated": 0,
        "errors": 0,
        "other_errors": 0,
        "refused": [],
        "requests": 1000,
        "requests_planned": 1000,
        "decode_steps": 10_000,
        "decode_steps_planned": 10_000,
        "same_output_fixed_seed": True,
        "memory_allocated_start": 3 << 30,
        "memory_allocated_end": (3 << 30) + (72 << 20),  # + the allocator's 8 MiB of tails
        "memory_requested_start": (3 << 30) - (1 << 20),
        "memory_requested_end": (3 << 30) + (63 << 20),  # 64 MiB more, all of it stashes
        "prefix_stash_bytes_start": 0,
        "prefix_stash_bytes_end": 60 << 20,
        "healing_bias_bytes_start": 1 << 20,
        "healing_bias_bytes_end": 5 << 20,  # 4 more healed texts' biases
        "healing_bias_bytes_bound": 10 << 20,
    }


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (
            {"quant_asked": "int4", "quant": "none", "quantization": "none"},
            "asked for int4 weights, the engine ran none",
        ),
        ({"graph_fallbacks": 1}, "graph fallbacks"),
        ({"graphs_not_captured": ["decode-greedy-0"]}, "not captured"),
        ({"graphs_captured": 0}, "no CUDA graph"),
        ({"lost": 1}, "never ended"),
        ({"other_duplicated": 1}, "after their DoneEvent"),
        ({"errors": 2}, "failed"),
        ({"requests": 990}, "990 of 1000"),
        ({"decode_steps": 9000}, "decoded 9000"),
        ({"same_output_fixed_seed": False}, "changed their tokens"),
        ({"memory_requested_end": (3 << 30) + (65 << 20)}, "requested memory grew by 2097152"),
        (  # a row from before requested bytes were recorded is judged on allocated bytes
            {"memory_requested_start": None, "memory_requested_end": None},
            "allocated memory grew by 8388608",
        ),
        (
            {"healing_bias_bytes_end": 11 << 20, "prefix_stash_bytes_end": 54 << 20},
            "above their bound",
        ),
    ],
)
def test_pass_rule_fails_each_defect(
    stability: ModuleType, change: dict[str, Any], reason: str
) -> None:
    assert stability.failures(passing_row(), cuda=True) == []
    why = stability.failures({**passing_row(), **change}, cuda=True)
    assert len(why) == 1 and reason in why[0], why


def test_int4_run_puts_the_int4_path_under_it_and_keeps_the_16_bit_row(
    stability: ModuleType, tmp_path: Path
) -> None:
    """--quant int4 runs the INT4 weights (as model-info reports them) and its row is merged
    beside, not over, the same device and shape's 16-bit row (older rows have no `quant`)."""
    today = dt.date.today().isoformat()
    earlier = {"shape": "nib-tiny-code", "device": "cpu", "passed": True, "decode_steps": 99}
    path = tmp_path / f"{today}-stability.json"
    path.write_text(json.dumps({"rows": [earlier]}))
    argv = ["--device", "cpu", "--steps", "12", "--requests", "6", "--max-new", "4"]
    rc = stability.main([*argv, "--warmup", "2", "--quant", "int4", "--out", str(tmp_path)])
    rows = json.loads(path.read_text())["rows"]
    assert rows[0] == earlier and len(rows) == 2
    row = rows[1]
    assert row["passed"] and rc == 0, row["failures"]
    assert (row["quant"], row["quant_asked"]) == ("int4", "int4")
    assert row["quantization"].startswith("int4-g128-"), row["quantization"]
    assert row["decode_steps"] == 12 and row["requests"] == 6
