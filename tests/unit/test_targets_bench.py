"""bench/targets.py: every issue target read from the right result file and row, judged
against its limit only on the card the limits were set on, and bench/README.md's table is
what the script makes of the committed results."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.bench_modules import load_bench

ROOT = Path(__file__).resolve().parents[2]
H200 = "NVIDIA H200 (132 SMs, 140 GiB)"
H100 = "NVIDIA H100 80GB HBM3 (132 SMs, 79 GiB)"


@pytest.fixture(scope="module")
def targets() -> ModuleType:
    return load_bench("targets")


def decode_rows(scale: float) -> list[dict[str, Any]]:
    """nib's graph rows; scale < 1 makes every decode figure meet its target."""
    rows = []
    for shape, bf16, int4, ttft16, ttft4 in (
        ("llama-2-7b", 3.5, 1.4, 11.0, 17.0),
        ("qwen2.5-coder-1.5b", 1.0, 0.6, 4.0, 5.5),
    ):
        for impl, ms, ttft in (("nib-graphs", bf16, ttft16), ("nib-int4-graphs", int4, ttft4)):
            for context, floor in ((640, ms / 2), (4096, ms / 1.4)):
                rows.append(
                    {
                        "shape": shape,
                        "impl": impl,
                        "context": context,
                        "ms_per_token_median": ms * scale * (1.25 if context == 4096 else 1),
                        "floor_ms": floor,
                        "ttft_ms": ttft,
                    }
                )
    return rows


def int4_rows(us: float) -> list[dict[str, Any]]:
    rows = []
    for model, n in (("llama-2-7b", 4), ("qwen2.5-coder-1.5b", 4)):
        for name in ("qkv", "o_proj", "gate_up", "down", "lm_head"):
            for m in (1, 16):
                for impl, factor in (("nib-int4", 1.0), ("torch-int4", 2.0)):
                    per = us / n if name != "lm_head" else us
                    rows.append(
                        {
                            "layer": f"{model}.{name}",
                            "m": m,
                            "impl": impl,
                            "us_median": per * factor,
                        }
                    )
    return rows


def wire_rows(ttft_gap: float) -> list[dict[str, Any]]:
    rows = []
    for shape in ("llama-2-7b", "qwen2.5-coder-1.5b"):
        row: dict[str, Any] = {
            "shape": shape,
            "serve_args": ["--quant=int4"],
            "spin": 0,
            "cancel_overrun_steps_max": 2,
        }
        for path in ("", "session_"):
            row[f"{path}client_inter_token_ms_median"] = 0.61
            row[f"{path}engine_inter_token_ms_median"] = 0.60
            row[f"{path}client_ttft_ms_median"] = 2.0 + ttft_gap
            row[f"{path}engine_ttft_ms_median"] = 2.0
        rows.append(row)
        # a 16-bit row and a row under spinners of the same shape: not issue 6's
        rows.append({**row, "serve_args": [], "client_ttft_ms_median": 99.0})
        rows.append({**row, "spin": 4, "client_ttft_ms_median": 99.0})
    return rows


def write(
    folder: Path, name: str, device: str, rows: list[dict[str, Any]], key: str = "device"
) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(json.dumps({"date": name[:10], key: device, "rows": rows}))


def stability_row(shape: str, quant: str | None, passed: bool, steps: int = 10_000) -> dict:
    row = {"shape": shape, "decode_steps": steps, "requests": 1000, "passed": passed}
    if quant is not None:
        row["quant"] = quant
    return row


def test_every_target_from_its_file_and_row(targets: ModuleType, tmp_path: Path) -> None:
    write(tmp_path, "2026-12-04-decode.json", H200, decode_rows(1.0))
    write(tmp_path, "2026-12-03-int4-linear.json", H200, int4_rows(36.0))
    write(tmp_path, "2026-12-03-wire.json", "NVIDIA H200", wire_rows(1.5), key="gpu")
    stability = [
        stability_row("llama-2-7b", "int4", True),
        stability_row("qwen2.5-coder-1.5b", None, True),  # 16-bit, before `quant`: not issue 6's
        stability_row("qwen2.5-coder-1.5b", "int4", True, steps=64),  # too short
    ]
    write(tmp_path, "2026-12-06-stability.json", H200, stability)
    got = {s.target.what: s for s in targets.standings(tmp_path)}
    assert len(got) == len(targets.TARGETS)

    def check(what: str, value: float | None, verdict: str, source: str) -> None:
        s = got[what]
        assert (s.verdict, s.source) == (verdict, source), (what, s)
        assert (s.value is None) == (value is None) and (
            value is None or s.value == pytest.approx(value)
        ), (what, s.value)

    dec, lin, wire = "2026-12-04-decode.json", "2026-12-03-int4-linear.json", "2026-12-03-wire.json"
    check("Llama-2-7B bf16 decode, context 640", 3.5, "met", dec)
    check("Qwen2.5-1.5B bf16 decode, context 640", 1.0, "missed", dec)
    check("Qwen2.5-1.5B bf16 time to first token, 512-token prompt", 4.0, "met", dec)
    check("Llama-2-7B INT4 decode at 4K context, over its floor", 1.4 * 1.25, "missed", dec)
    check("Qwen2.5-1.5B INT4 decode, context 640", 0.6, "missed", dec)
    check("INT4 kernels: one Llama-2-7B layer's four linears, M=1", 36.0, "missed", lin)
    check("INT4 kernels: one Qwen2.5-1.5B layer's four linears, M=1", 36.0, "missed", lin)
    check("INT4 kernels: Llama-2-7B lm_head, M=1", 36.0, "missed", lin)
    check("Qwen2.5-1.5B INT4 client inter-token over the engine's, Session", 0.01, "met", wire)
    check(
        "Llama-2-7B INT4 client time to first token off the engine's, Complete", 1.5, "missed", wire
    )
    check("Llama-2-7B INT4 steps after a cancel (Session)", 2, "met", wire)
    stab = "2026-12-06-stability.json"
    check("Llama-2-7B INT4: 10,000 steps and 1,000 requests, rows failed", 0, "met", stab)
    check(
        "Qwen2.5-1.5B INT4: 10,000 steps and 1,000 requests, rows failed",
        None,
        "not measured",
        stab,
    )


def test_limits_are_judged_only_on_their_card(targets: ModuleType, tmp_path: Path) -> None:
    """An H100 result under an H200 limit is "within the limit (H100)", never "met"; the
    H200's verdicts come from the H200's file even where another card's is newer."""
    write(tmp_path, "2026-12-01-decode.json", H200, decode_rows(0.1))
    write(tmp_path, "2026-12-06-decode-h100.json", H100, decode_rows(0.1))
    on_h200 = [s for s in targets.standings(tmp_path) if s.target.kind == "decode"]
    assert {s.source for s in on_h200} == {"2026-12-01-decode.json"}
    assert {s.verdict for s in on_h200} == {"met"}
    on_h100 = [s for s in targets.standings(tmp_path, "H100") if s.target.kind == "decode"]
    assert {s.source for s in on_h100} == {"2026-12-06-decode-h100.json"}
    assert {s.verdict for s in on_h100} == {"within the limit (H100)"}
    assert not any("met" in line for line in targets.table(on_h100))


def test_stability_is_judged_on_any_gpu_never_the_cpu(targets: ModuleType, tmp_path: Path) -> None:
    """Stability is a pass or fail asked of the GPU, not an H200 figure: the newest GPU
    result counts whatever the card, named beside the file; a CPU run never does."""
    rows = [
        stability_row(s, "int4", s == "llama-2-7b") for s in ("llama-2-7b", "qwen2.5-coder-1.5b")
    ]
    write(tmp_path, "2026-12-02-stability.json", H200, [stability_row("llama-2-7b", "int4", False)])
    write(tmp_path, "2026-12-06-stability.json", H100, rows)
    write(
        tmp_path, "2026-12-07-stability.json", "cpu", [stability_row("llama-2-7b", "int4", False)]
    )
    for card in ("H200", "H100"):
        got = {s.target.what: s for s in targets.standings(tmp_path, card) if s.target.any_gpu}
        seven = got["Llama-2-7B INT4: 10,000 steps and 1,000 requests, rows failed"]
        qwen = got["Qwen2.5-1.5B INT4: 10,000 steps and 1,000 requests, rows failed"]
        assert (seven.verdict, qwen.verdict) == ("met", "missed")
        assert seven.source == "2026-12-06-stability.json" and seven.device == H100
    (line,) = [x for x in targets.table(list(got.values())) if "Llama-2-7B INT4: 10,000" in x]
    assert line.endswith("`2026-12-06-stability.json` (NVIDIA H100 80GB HBM3) |")


def test_each_target_from_the_newest_file_that_measured_it(
    targets: ModuleType, tmp_path: Path
) -> None:
    """A newer run of one shape (STABILITY_SHAPES, DECODE_IMPLS) leaves the other shape's
    figure from the older file standing, and the newer file wins where it measured."""
    both = [stability_row(s, "int4", False) for s in ("llama-2-7b", "qwen2.5-coder-1.5b")]
    write(tmp_path, "2026-12-06-stability.json", H100, both)
    write(tmp_path, "2026-12-07-stability.json", H100, [stability_row("llama-2-7b", "int4", True)])
    bf16_only = [r for r in decode_rows(0.1) if r["impl"] == "nib-graphs"]
    write(tmp_path, "2026-12-04-decode.json", H200, decode_rows(1.0))
    write(tmp_path, "2026-12-05-decode.json", H200, bf16_only)
    got = {s.target.what: s for s in targets.standings(tmp_path)}
    seven = got["Llama-2-7B INT4: 10,000 steps and 1,000 requests, rows failed"]
    qwen = got["Qwen2.5-1.5B INT4: 10,000 steps and 1,000 requests, rows failed"]
    assert (seven.verdict, seven.source) == ("met", "2026-12-07-stability.json")
    assert (qwen.verdict, qwen.source) == ("missed", "2026-12-06-stability.json")
    bf16 = got["Llama-2-7B bf16 decode, context 640"]
    int4 = got["Llama-2-7B INT4 decode, context 640"]
    assert (bf16.value, bf16.source) == (pytest.approx(0.35), "2026-12-05-decode.json")
    assert (int4.value, int4.source) == (pytest.approx(1.4), "2026-12-04-decode.json")
    # A target no file measured names the newest file of its kind.
    write(tmp_path, "2026-12-08-wire.json", H200, [])
    got = {s.target.what: s for s in targets.standings(tmp_path)}
    cancel = got["Llama-2-7B INT4 steps after a cancel (Session)"]
    assert (cancel.value, cancel.verdict) == (None, "not measured")
    assert cancel.source == "2026-12-08-wire.json"


def test_newest_file_by_date_then_commit_and_never_an_experiment(
    targets: ModuleType, tmp_path: Path
) -> None:
    folder = tmp_path / "results"
    write(folder, "2026-12-05-int4-linear.json", H100, int4_rows(50.0))
    write(folder, "2026-12-06-int4-linear-h100-xpf.json", H100, int4_rows(47.0))
    write(folder, "2026-12-06-int4-linear-h100.json", H100, int4_rows(51.0))
    write(folder, "2026-12-07-int4-stream-experiment.json", H100, int4_rows(1.0))
    write(folder, "2026-12-07-int4-linear-experiment.json", H100, int4_rows(1.0))
    # Without git the day's files go by name: "-h100.json" after "-h100-xpf.json".
    assert targets.newest(folder, "int4-linear", "H100")[0] == "2026-12-06-int4-linear-h100.json"
    # In git the one committed last is the newest, whatever its name.
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@localhost"}
    env |= {"GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@localhost"}

    def git(*args: str, date: str = "2026-12-06T10:00:00") -> None:
        when = {"GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date}
        subprocess.run(
            ["git", *args], cwd=tmp_path, env=env | when, check=True, capture_output=True
        )

    git("init", "-q")
    git("add", "results/2026-12-06-int4-linear-h100.json", "results/2026-12-05-int4-linear.json")
    git("commit", "-q", "-m", "first")
    git("add", "results")
    git("commit", "-q", "-m", "second", date="2026-12-06T11:00:00")
    name, result = targets.newest(folder, "int4-linear", "H100")
    assert name == "2026-12-06-int4-linear-h100-xpf.json"
    assert targets.linear_us(result, targets.layer("llama-2-7b"), 16) == pytest.approx(47.0)
    assert targets.newest(folder, "int4-linear", "H200") is None


def test_fail_on_miss_and_json(targets: ModuleType, tmp_path: Path) -> None:
    folder = tmp_path / "results"
    write(folder, "2026-12-04-decode.json", H200, decode_rows(0.1))
    write(folder, "2026-12-03-int4-linear.json", H200, int4_rows(10.0))
    write(folder, "2026-12-03-wire.json", H200, wire_rows(0.5))
    rows = [stability_row(s, "int4", True) for s in ("llama-2-7b", "qwen2.5-coder-1.5b")]
    write(folder, "2026-12-06-stability.json", H200, rows)
    out = tmp_path / "t.json"
    assert targets.main(["--results", str(folder), "--fail-on-miss", "--json", str(out)]) == 0
    standing = json.loads(out.read_text())
    assert {r["verdict"] for r in standing["rows"]} == {"met"}
    assert len(standing["rows"]) == len(targets.TARGETS)
    write(folder, "2026-12-07-int4-linear.json", H200, int4_rows(33.0))  # a 7B layer over 32
    assert targets.main(["--results", str(folder), "--fail-on-miss"]) == 1
    assert targets.main(["--results", str(folder)]) == 0
    (folder / "2026-12-06-stability.json").unlink()  # not measured counts as a miss
    write(folder, "2026-12-08-int4-linear.json", H200, int4_rows(10.0))
    assert targets.main(["--results", str(folder), "--fail-on-miss"]) == 1


def test_the_readme_table_is_the_committed_results(targets: ModuleType) -> None:
    text = (ROOT / "bench" / "README.md").read_text()
    m = re.search(r"<!-- BEGIN targets -->\n(.*?)\n<!-- END targets -->", text, re.S)
    assert m, "no targets block in bench/README.md"
    lines = m.group(1).split("\n")
    assert lines[0] == targets.caption(targets.CARD)
    assert lines[2:] == targets.table(targets.standings())


def test_readme_table_is_written_without_torch(tmp_path: Path) -> None:
    """`--readme` needs no GPU and no torch: it goes through bench/common.py, which
    imports torch only in the functions that measure."""
    readme = tmp_path / "README.md"
    readme.write_text("# Benchmarks\n\n<!-- BEGIN targets -->\nold\n<!-- END targets -->\n")
    script = (
        "import sys; from pathlib import Path; sys.path.insert(0, 'bench'); import common;"
        f"common.README = Path({str(readme)!r}); import targets;"
        "targets.main(['--readme']); assert 'torch' not in sys.modules, 'torch imported'"
    )
    run = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    text = readme.read_text()
    assert "old" not in text and "| issue | target | limit |" in text
