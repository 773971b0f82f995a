"""bench/step_timeline.py on the GPU: the traced kernels record every block of every
launch of a decode step, in an order and with times that can be true."""

from __future__ import annotations

from pathlib import Path

from tests.gpu.bench_run import run_bench


def test_every_block_of_a_decode_step_is_recorded_in_a_possible_order(tmp_path: Path) -> None:
    args = ["--shapes", "tiny-llama", "--formats", "int4,bf16", "--replays", "3"]
    args += ["--position", "200", "--pick", "fused"]
    result = run_bench("step_timeline.py", args, tmp_path, "step-timeline")
    rows = {r["format"]: r for r in result["rows"]}
    assert set(rows) == {"int4", "bf16"}
    for fmt, row in rows.items():
        assert row["all_instances_complete"], fmt
        assert row["clock_tick_ns"] >= 1
        shares = 0.0
        for r in row["roles"]:
            # A block passes griddepcontrol.wait only after the kernel before it has ended
            # (one clock for all SMs: allow a tick of skew), and leaves after it waited.
            assert r["release_us"] >= -0.05 - row["clock_tick_ns"] / 1e3, (fmt, r)
            assert r["after_wait_us"] >= 0 and r["interval_us"] > 0 and r["tail_us"] >= 0, (fmt, r)
            assert 0.0 <= r["resident"] <= 1.0
            shares += r["interval_us_per_step"]
        # The intervals tile the step from the first traced kernel's end to the last's:
        # together no longer than the traced replay.
        assert 0 < shares <= row["replay_us_median"] * 1.02, (fmt, shares, row["replay_us_median"])
    # INT4: every linear is nib's CUDA kernel, so the step's kernels are named.
    layers = rows["int4"]["layers"]
    # The embedding lookup first (nib's kernel), five a layer, the lm_head with the greedy
    # pick folded in (--pick fused: GraphRunner.fuse_pick).
    assert rows["int4"]["traced_kernels_per_step"] == 5 * layers + 2
    roles = [r["role"] for r in rows["int4"]["roles"]]
    assert roles == ["qkv", "attention", "o_proj", "gate_up", "down", "lm_head"]
    counts = {r["role"]: r["count_per_step"] for r in rows["int4"]["roles"]}
    assert counts["qkv"] == layers and counts["down"] == layers and counts["lm_head"] == 1
    assert rows["int4"]["pick_fused"] and not rows["bf16"]["pick_fused"]
    # bf16: the 16-bit lm_head, then the greedy kernel.
    greedy = [r for r in rows["bf16"]["roles"] if r["kernel"].startswith("greedy")]
    assert len(greedy) == 1 and greedy[0]["count_per_step"] == 1, rows["bf16"]["roles"]
    # The GEMVs and the attention mark their phases; on one SM's thread the marks come in
    # order, and the last block's phases fit inside the time after the first wait.
    tick = rows["int4"]["clock_tick_ns"] / 1e3
    for r in rows["int4"]["roles"]:
        if r["role"] in ("greedy", "embed"):
            assert "phases" not in r, r
            continue
        assert len(r["phases"]) == len(r["phase_us_median"]) in (3, 4), r
        assert all(v >= 0 for v in r["phase_us_median"]), r
        assert r["phase_us_last_block"] and all(v >= 0 for v in r["phase_us_last_block"]), r
    marked = [b for b in rows["int4"]["layer_boundaries_last_replay"] if b.get("phases")]
    assert len(marked) >= 4 * layers, len(marked)  # every GEMV and attention of the step
    for b in marked:  # one launch: its last block waited no earlier than its first
        assert sum(b["phase_us_last_block"]) <= b["after_wait_us"] + tick, b


def test_the_separate_pick_follows_the_lm_head_early(tmp_path: Path) -> None:
    """--pick separate: the INT4 step with the pick a kernel of its own.
    The greedy kernel advances the position itself, so nothing but the lm_head is before
    it: it launches while the lm_head finishes (programmatic dependent launch)."""
    args = ["--shapes", "tiny-llama", "--formats", "int4", "--replays", "2", "--pick"]
    args += ["separate"]
    args += ["--position", "200"]
    (row,) = run_bench("step_timeline.py", args, tmp_path, "step-timeline")["rows"]
    layers = row["layers"]
    assert not row["pick_fused"] and row["traced_kernels_per_step"] == 5 * layers + 3
    roles = [r["role"] for r in row["roles"]]
    assert roles == ["qkv", "attention", "o_proj", "gate_up", "down", "lm_head", "greedy"]
    greedy = next(r for r in row["roles"] if r["role"] == "greedy")
    assert greedy["count_per_step"] == 1 and greedy["lead_us"] > 0, greedy
