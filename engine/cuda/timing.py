"""Timing candidate kernels the way the decode step runs them: back to back in a CUDA graph.

Start-up picks tile shapes per layer by timing. Timed eagerly, a launch through
ctypes costs the host more than a small kernel costs the GPU, so every
candidate would look the same; inside a captured graph only the GPU's time
remains, and with programmatic dependent launch the overlap between
consecutive kernels counts as it will in the decode graph.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Callable, Sequence

import torch


def graph_us(fns: Sequence[Callable[[], object]], calls: int = 0, reps: int = 7) -> float:
    """Median microseconds per call of `fns` run round-robin inside one CUDA graph
    (at least `calls` calls per replay, and every fn at least twice)."""
    n = max(calls, 2 * len(fns))
    for f in fns:
        f()  # allocate what the calls need before capture
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        for i in range(n):
            fns[i % len(fns)]()
    us = replay_us(graph, n, reps)
    del graph
    return us


# The GPU spins this long (~1 ms at the H200's clock) in front of the first timed replay:
# the host queues the timed replays meanwhile, so none of them waits for its launch.
LEAD_CYCLES = 2_000_000


def replay_us(
    graph: torch.cuda.CUDAGraph, per_replay: int, reps: int, hide_launch: bool = True
) -> float:
    """Median microseconds per unit of a captured graph that holds `per_replay` units,
    over `reps` timed replays on the current stream (after one untimed replay).

    hide_launch: the replays run back to back behind a spin kernel, an event between
    each two, so a replay's time is the GPU's alone, as in the decode loop, where the
    next replay is queued while one runs. Without it (each replay between two events on
    an idle GPU, the way this was timed before 2026-12-03) the host's launch of the graph
    lands inside the interval, and its jitter with it: 2-4 µs a step of the step tuner's
    graph on the H200 (bench/replay_timing.py)."""
    graph.replay()
    torch.cuda.current_stream().synchronize()
    if hide_launch:
        marks = [torch.cuda.Event(enable_timing=True) for _ in range(reps + 1)]
        torch.cuda._sleep(LEAD_CYCLES)
        marks[0].record()
        for mark in marks[1:]:
            graph.replay()
            mark.record()
        marks[-1].synchronize()
        times = [a.elapsed_time(b) * 1e3 / per_replay for a, b in itertools.pairwise(marks)]
    else:
        times = []
        for _ in range(reps):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3 / per_replay)
    return statistics.median(times)
