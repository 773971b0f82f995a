"""Choosing the decode step's kernel configs by timing the decode step itself.

Start-up first times each layer shape's tile configs on their own (kernels/gemv.py,
cuda/int4_swap.py): every layer of the shape in turn, inside a CUDA graph. That
ranks configs well but does not see what a config does next to its neighbours in
the real step, where each kernel starts while the previous one finishes
(programmatic dependent launch) and the shapes alternate. Measured on the H200
(bench/decode.py, two start-ups on 2026-12-01), timing the step itself took the
INT4 Qwen2.5-1.5B step from 840 to 765 and from 724 to 715 us, the 16-bit one
from 1296 to 1236 and from 1226 to 1198 us.
So the runners-up of each shape (STEP_CANDIDATES, fastest first) are then tried
in the captured decode step, one shape at a time (coordinate descent, PASSES
passes): each option is applied, a graph of a few decode steps at a mid-context
position is captured and replayed, and the fastest option stays. A change must
beat the current choice by more than NOISE to be taken, and if the whole step
then measures slower than before (noise can pick a loser: once 1220 -> 1252 us),
every shape goes back to its per-shape pick.

Every option is a config the kernel tests cover, and the self-check runs after
this on what was chosen; only time depends on the choice. One more knob, where asked
for (GraphRunner.tune_pick), is where the greedy pick runs (its own kernel, or folded
into the INT4 lm_head's epilogue). (An L2 prefetch of the
next layers' weights was a knob here too; measured on the H200 it never won once
configs were tuned this way, and it was removed. bench/results/
2026-12-01-l2-prefetch.json holds its A/B, from commit 7fd9a52.)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from nib.engine.cuda.timing import replay_us

log = logging.getLogger("nib.engine")

STEP_CANDIDATES = 6  # configs per layer shape that the whole step times
PASSES = 2  # over all knobs: a shape's best can move once its neighbours have
NOISE = 0.003  # relative: a new choice must be this much faster than the current one


@dataclass
class Knob:
    """One choice the step is tuned over: options[0] is what runs now."""

    name: str
    options: list[Any]
    apply: Callable[[Any], None]
    label: Callable[[Any], str]
    times_us: list[float] = field(default_factory=list)
    chosen: int = 0


def _config_knobs(model: nn.Module) -> list[Knob]:
    from nib.engine.kernels.gemv import GemvLinear, config_label, split_buffers
    from nib.engine.quant.linear import Int4Linear

    int4: dict[tuple[int, int, str], list[Any]] = {}
    gemv: dict[tuple[int, int, str], list[GemvLinear]] = {}
    for m in model.modules():
        if isinstance(m, Int4Linear) and m.cuda is not None and len(m.cuda.one_row_candidates) > 1:
            int4.setdefault((m.cuda.n, m.cuda.k, m.cuda.fusion), []).append(m.cuda)
        elif isinstance(m, GemvLinear) and m.fused is not None and len(m.fused_candidates) > 1:
            gemv.setdefault((m.out_features, m.in_features, m.fusion), []).append(m)
    knobs: list[Knob] = []
    for (n, k, fusion), packs in int4.items():

        def apply_int4(cfg: Any, packs: list[Any] = packs) -> None:
            for p in packs:
                p.prepare(cfg, 1)
                p.one_row = cfg

        options = [packs[0].one_row] + [
            c for c in packs[0].one_row_candidates if c != packs[0].one_row
        ]
        knobs.append(
            Knob(f"int4 {n}x{k} +{fusion or 'plain'}", options, apply_int4, lambda c: c.label())
        )
    for (n, k, fusion), mods in gemv.items():

        def apply_gemv(cfg: Any, mods: list[GemvLinear] = mods) -> None:
            for m in mods:
                fused_n = m.out_features // 2 if m.fusion == "norm_glu" else m.out_features
                m.fused_buffers = split_buffers(fused_n, cfg, m.weight.device)
                m.fused = cfg

        options = [mods[0].fused] + [c for c in mods[0].fused_candidates if c != mods[0].fused]
        knobs.append(Knob(f"gemv {n}x{k} +{fusion}", options, apply_gemv, config_label))
    return knobs


def step_us(runner: Any, steps: int = 4, reps: int = 12, hide_launch: bool = True) -> float:
    """Median µs of one greedy decode step: a graph of `steps` steps at a mid-context
    position (the position reset before each), replayed `reps` times (cuda/timing.
    replay_us: the graph's launch kept out of the time unless hide_launch is False)."""
    body = runner.bodies[runner._decode_name(0, True)]
    p0 = max(1, min(512, runner.max_context // 2))
    with torch.cuda.stream(runner.stream), torch.inference_mode():
        for _ in range(2):  # warm: compiles, allocates
            runner.pos.fill_(p0)
            body()
    runner.stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.inference_mode(), torch.cuda.graph(graph, stream=runner.stream):
        for _ in range(steps):
            runner.pos.fill_(p0)
            body()
    with torch.cuda.stream(runner.stream):
        us = replay_us(graph, steps, reps, hide_launch)
    del graph
    return us


def _pick_knob(runner: Any) -> list[Knob]:
    """Where the greedy pick runs: a kernel of its own after the lm_head (options[0], the
    default) or folded into the INT4 lm_head's epilogue (graphs.PickingHead), where the
    runner can fold it. One boundary fewer, but every block of the lm_head merges its
    logits and draws a ticket: on the H200 that cost more than it saved
    (bench/fused_pick.py), so the knob is offered only where runner.tune_pick asks for
    it, and then kept only where the step measures faster."""
    fusable = getattr(runner, "pick_fusable", None)
    if not getattr(runner, "tune_pick", False) or fusable is None or not fusable():
        return []

    def apply(fused: bool) -> None:
        runner.fuse_pick = fused

    current = bool(runner.fuse_pick)
    return [
        Knob(
            "greedy pick",
            [current, not current],
            apply,
            lambda fused: "fused into the lm_head" if fused else "separate kernel",
        )
    ]


def descend(knobs: list[Knob], measure: Callable[[], float]) -> None:
    """One pass of coordinate descent: each knob in turn tries its options (measure()
    after each apply) and keeps the fastest, unless it beats the current choice
    (options[knob.chosen]: options[0] before the first pass) by no more than NOISE."""
    for knob in knobs:
        knob.times_us = []
        for option in knob.options:
            knob.apply(option)
            knob.times_us.append(measure())
        best = min(range(len(knob.options)), key=knob.times_us.__getitem__)
        if knob.times_us[best] >= knob.times_us[knob.chosen] * (1 - NOISE):
            best = knob.chosen
        knob.chosen = best
        knob.apply(knob.options[best])
        log.debug(
            "step tuning %s: %s", knob.name,
            ", ".join(f"{knob.label(o)} {t:.1f} us" for o, t in zip(knob.options, knob.times_us, strict=True)),
        )  # fmt: skip


def tune(
    knobs: list[Knob], measure: Callable[[], float], passes: int = PASSES
) -> tuple[float, float, bool]:
    """PASSES of descend(), then a check of the whole: if the step now measures slower
    than before by more than NOISE (each option is timed once, so noise can pick a
    loser), every knob goes back to options[0]. Returns (before, after, reverted)."""
    first = measure()
    for _ in range(passes):
        descend(knobs, measure)
    last = measure()
    if last <= first * (1 + NOISE):
        return first, last, False
    for knob in knobs:
        knob.chosen = 0
        knob.apply(knob.options[0])
    return first, measure(), True


def tune_step(runner: Any) -> dict[str, str]:
    """Tune every knob of runner.model's decode step (see the module doc), before the
    runner captures its graphs. Returns {knob: chosen option's label}."""
    model = runner.model
    knobs = _config_knobs(model) + _pick_knob(runner)
    if not knobs:
        return {}
    started = time.perf_counter()
    first, last, reverted = tune(knobs, lambda: step_us(runner))
    torch.cuda.empty_cache()
    chosen = {k.name: k.label(k.options[k.chosen]) for k in knobs}
    log.info(
        "decode step tuned in %.1fs: %.1f -> %.1f us per step%s; %s",
        time.perf_counter() - started, first, last,
        " (slower: kept the per-shape choices)" if reverted else "", chosen,
    )  # fmt: skip
    runner.step_tuning = {
        "before_us": first, "after_us": last, "reverted": reverted, "chosen": chosen,
    }  # fmt: skip
    return chosen
