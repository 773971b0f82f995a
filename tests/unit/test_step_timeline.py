"""bench/step_timeline.py's analysis on records made up here: launches are told apart,
named by their place in the step, and every figure is the distance it says it is."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def st(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import step_timeline

    return step_timeline


def records(st, kind: int, grid: int, threads: int, starts, waits, ends, sm0: int = 0):  # type: ignore[no-untyped-def]
    r = np.zeros(len(starts), dtype=st.RECORD)
    r["start"], r["waited"], r["end"] = starts, waits, ends
    r["smid"] = [sm0 + i for i in range(len(starts))]
    r["kind"], r["grid"], r["threads"] = kind, grid, threads
    return r


def test_importing_the_script_leaves_the_kernels_untraced(st) -> None:  # type: ignore[no-untyped-def]
    assert os.environ.get("NIB_CUDA_TRACE", "0") != "1"
    assert st.RECORD.itemsize == 64  # common.cuh's NibTraceRecord: 6 x u64 + 4 x u32
    text = (Path(st.__file__).parents[1] / "engine" / "cuda" / "common.cuh").read_text()
    assert "static_assert(sizeof(NibTraceRecord) == 64" in text
    assert "#define NIB_TRACE_MARKS 3" in text and st.RECORD["marks"].shape == (3,)


def test_two_launches_of_one_kernel_are_two_instances_in_launch_order(st) -> None:  # type: ignore[no-untyped-def]
    # A (2 blocks) -> B (1 block, another module) -> A again: same kind, grid and threads.
    a1 = records(st, 1, 2, 128, [1000, 1010], [1100, 1100], [2000, 2200])
    b = records(st, 4, 1, 256, [1500], [2300], [3000])
    a2 = records(st, 1, 2, 128, [2900, 2950], [3200, 3250], [4000, 4500])
    recs = [("w4a16.cu", np.concatenate([a2, a1])), ("attention.cu", b)]  # unordered
    inst = st.group_instances(recs)
    assert [i.module for i in inst] == ["w4a16.cu", "attention.cu", "w4a16.cu"]
    assert [len(i.starts) for i in inst] == [2, 1, 2] and all(i.complete for i in inst)
    assert inst[0].starts == [1000, 1010] and inst[2].starts == [2900, 2950]

    bs = st.boundaries(inst, ["qkv", "attention", "o_proj"])
    assert [b["role"] for b in bs] == ["attention", "o_proj"]
    att, o = bs
    # attention: previous kernel's last block left at 2200.
    assert att["interval_us"] == pytest.approx((3000 - 2200) / 1e3)
    assert att["release_us"] == pytest.approx((2300 - 2200) / 1e3)
    assert att["after_wait_us"] == pytest.approx((3000 - 2300) / 1e3)
    assert att["lead_us"] == pytest.approx((2200 - 1500) / 1e3)
    assert att["resident"] == 1.0
    # o_proj: attention left at 3000; one of two blocks had started by then.
    assert o["lead_us"] == pytest.approx((3000 - 2900) / 1e3)
    assert o["resident"] == 1.0
    assert o["release_us"] == pytest.approx((3200 - 3000) / 1e3)
    assert o["tail_us"] == pytest.approx((4500 - 4500) / 1e3)  # median of 2 ends is the later
    assert o["sms"] == 2


def test_an_incomplete_launch_is_reported_not_hidden(st) -> None:  # type: ignore[no-untyped-def]
    a = records(st, 1, 3, 128, [0, 5], [10, 10], [50, 60])  # 2 of 3 blocks recorded
    b = records(st, 5, 1, 256, [70], [80], [90])
    inst = st.group_instances([("w4a16.cu", a), ("greedy.cu", b)])
    assert not inst[0].complete
    (bound,) = st.boundaries(inst, ["x", "y"])
    assert bound["complete"] is True  # greedy's own launch is whole
    assert bound["resident"] == 0.0 and bound["lead_us"] < 0


def test_roles_name_the_step_when_the_count_fits_and_fall_back_to_labels(st) -> None:  # type: ignore[no-untyped-def]
    pick = st.Instance("g", 5, 8, 256)
    inst = [st.Instance("m", 1, 4, 128) for _ in range(5 * 2 + 1)] + [pick]
    names = st.roles(inst, layers=2)
    assert names[:6] == ["qkv", "attention", "o_proj", "gate_up", "down", "qkv"]
    assert names[-2:] == ["lm_head", "greedy"]
    assert st.roles(inst[:7], layers=2) == ["w4a16 4x128"] * 7
    # With nib's embedding kernel first, one more launch: named too.
    names = st.roles([st.Instance("e", 6, 1, 256), *inst], layers=2)
    assert names[:3] == ["embed", "qkv", "attention"] and names[-2:] == ["lm_head", "greedy"]
    # The pick folded into the lm_head: the step ends with it, as many kernels as an
    # embedding lookup and a separate pick would be without the first: the kinds decide.
    fused = [st.Instance("e", 6, 1, 256), *inst[:-1]]
    names = st.roles(fused, layers=2)
    assert names[0] == "embed" and names[-2:] == ["down", "lm_head"]
    assert st.roles(inst, layers=2)[0] == "qkv"  # same count, no embedding kernel first
    assert st.Instance("e", 6, 1, 256).label == "embed 1x256"


def test_summary_is_the_median_per_role_and_the_step_share_sums_its_intervals(st) -> None:  # type: ignore[no-untyped-def]
    def b(role: str, interval: float) -> dict[str, object]:
        return {"role": role, "kernel": "k", "after": "p", "interval_us": interval, "release_us": 1.0,
                "after_wait_us": 2.0, "tail_us": 0.5, "lead_us": 0.1, "resident": 1.0,
                "blocks": 4, "sms": 4, "complete": True}  # fmt: skip

    per_replay = [[b("o_proj", 1.0), b("down", 5.0), b("o_proj", 3.0)],
                  [b("o_proj", 2.0), b("down", 7.0), b("o_proj", 4.0)]]  # fmt: skip
    rows = {r["role"]: r for r in st.summarise(per_replay)}
    assert list(rows) == ["o_proj", "down"]
    assert rows["o_proj"]["count_per_step"] == 2 and rows["down"]["count_per_step"] == 1
    assert rows["o_proj"]["interval_us"] == 2.5  # median of 1, 3, 2, 4
    assert rows["o_proj"]["interval_us_per_step"] == 5.0  # (1 + 3 + 2 + 4) / 2 replays
    assert rows["down"]["interval_us"] == 6.0


def test_the_clock_tick_is_the_gcd_of_the_stamps(st) -> None:  # type: ignore[no-untyped-def]
    a = records(st, 1, 3, 128, [1024, 1056, 2048], [0, 0, 0], [3072, 4096, 1088])
    assert st.tick_ns([("m", a)]) == 32
    c = records(st, 1, 2, 128, [1000, 1001], [0, 0], [1003, 1010])
    assert st.tick_ns([("m", c)]) == 1


def test_phases_split_the_time_after_the_wait_at_each_mark(st) -> None:  # type: ignore[no-untyped-def]
    # A GEMV (kind 1, two marks) of two blocks, then an attention (kind 4, three marks)
    # whose second block left before its first mark (an unused split): not a phase sample.
    g = records(st, 1, 2, 128, [0, 10], [1000, 1100], [5000, 6000])
    g["marks"] = [[1500, 4000, 0], [1700, 5200, 0]]
    a = records(st, 4, 2, 256, [5100, 5200], [6100, 6200], [9000, 6300])
    a["marks"] = [[6600, 7600, 8000], [0, 0, 0]]
    inst = st.group_instances([("w4a16.cu", g), ("attention.cu", a)])
    gemv = st.phase_stats(inst[0])
    assert gemv["phases"] == ["stage x", "stream weights", "reduce + epilogue"]
    # block 0: 0.5 / 2.5 / 1.0 us, block 1: 0.6 / 3.5 / 0.8; medians of two: the means.
    assert gemv["phase_us_median"] == pytest.approx([0.55, 3.0, 0.9])
    assert gemv["phase_us_last_block"] == pytest.approx([0.6, 3.5, 0.8])
    att = st.phase_stats(inst[1])
    assert att["phases"][0] == "rope + q" and len(att["phases"]) == 4
    assert att["phase_us_median"] == pytest.approx([0.5, 1.0, 0.4, 1.0])  # block 0 only
    assert att["phase_us_last_block"] == pytest.approx([0.5, 1.0, 0.4, 1.0])
    assert st.phase_stats(st.Instance("g", 5, 1, 256)) == {}  # greedy marks nothing
    (bound,) = st.boundaries(inst, ["gate_up", "attention"])
    assert bound["phase_us_median"] == att["phase_us_median"]
    rows = st.summarise([[bound], [bound]])
    assert rows[0]["phase_us_median"] == pytest.approx(att["phase_us_median"])
    table = st.phase_table([{"shape": "s", "format": "int4", "roles": rows}])
    assert table[2].startswith("| s | int4 | attention | rope + q / attend tiles")
    assert "0.50 / 1.00 / 0.40 / 1.00" in table[2]
