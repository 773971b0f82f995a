"""engine/cuda/timing.replay_us on the GPU: a replay's time is the GPU's, not the host's
launch of it (what start-up's config choices are timed with), and bench/replay_timing.py
runs both measures and the tunings they drive."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from nib.engine.cuda.timing import replay_us
from tests.gpu.bench_run import run_bench

pytestmark = pytest.mark.gpu


def _needs_cuda() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")


def _matmul_graph() -> torch.cuda.CUDAGraph:
    """A graph of a few fp16 matrix products: ~100 µs of GPU work on an H200."""
    a = torch.randn(2048, 2048, device="cuda", dtype=torch.float16)
    out = torch.empty_like(a)
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    torch.matmul(a, a, out=out)
    torch.cuda.synchronize()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        for _ in range(4):
            torch.matmul(a, a, out=out)
    graph._keep = (a, out)  # type: ignore[attr-defined]
    return graph


class SlowLaunch:
    """A graph whose launch keeps the host busy `delay_s` first, as a slow launch would."""

    def __init__(self, graph: torch.cuda.CUDAGraph, delay_s: float) -> None:
        self.graph, self.delay_s = graph, delay_s

    def replay(self) -> None:
        until = time.perf_counter() + self.delay_s
        while time.perf_counter() < until:
            pass
        self.graph.replay()


def test_a_replay_is_timed_as_the_gpu_runs_it_back_to_back() -> None:
    _needs_cuda()
    graph = _matmul_graph()
    got = replay_us(graph, 1, 9)
    graph.replay()  # the reference: many replays between two events, launches queued ahead
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(50):
        graph.replay()
    end.record()
    end.synchronize()
    reference = start.elapsed_time(end) * 1e3 / 50
    assert reference > 20, reference  # real work, not a launch
    assert abs(got - reference) < 0.05 * reference, (got, reference)


def test_the_hosts_launch_time_stays_out_of_the_measure() -> None:
    _needs_cuda()
    graph = _matmul_graph()
    fast = replay_us(graph, 1, 9)
    delay_us = 1.5 * fast  # slower than the GPU: only the lead in front hides it
    slow = SlowLaunch(graph, delay_us / 1e6)
    hidden = replay_us(slow, 1, 9)  # type: ignore[arg-type]
    inclusive = replay_us(slow, 1, 9, hide_launch=False)  # type: ignore[arg-type]
    assert inclusive - fast > 0.8 * delay_us, (fast, inclusive, delay_us)  # the delay is real
    assert hidden - fast < 0.1 * delay_us, (fast, hidden, delay_us)


def test_replay_timing_bench_runs_both_measures_and_their_tunings(tmp_path: Path) -> None:
    _needs_cuda()
    from nib.engine.cuda.loader import unavailable_reason

    if why := unavailable_reason(torch.device("cuda")):
        pytest.skip(why)
    args = ["--shapes", "tiny-llama", "--rounds", "2", "--tunings", "1"]
    result = run_bench("replay_timing.py", args, tmp_path, "replay-timing", timeout=900)
    (row,) = result["rows"]
    assert row["shape"] == "tiny-llama" and row["format"] == "int4"
    for name in ("launch-inclusive", "launch-hidden"):
        m = row["measure_rounds"][name]
        assert len(m["us"]) == 2 and 0 < m["min"] <= m["median"] <= m["max"]
    assert [t["measure"] for t in row["tunings"]] == ["launch-inclusive", "launch-hidden"]
    for t in row["tunings"]:
        assert t["before_us"] > 0 and t["after_us"] > 0 and t["chosen"]
    picks = row["picks"]
    assert picks[0]["from"][0] == "per-shape"
    assert sorted(j for p in picks for j in p["from"] if j != "per-shape") == [0, 1]
    for p in picks:
        assert len(p["step_us_rounds"]) == 2 and p["step_us_median"] > 0
