"""Where a decode step's time goes, kernel by kernel, on the GPU's own clock.

    python3 bench/step_timeline.py --out bench/results       # both shapes, INT4 and bf16

With programmatic dependent launch a kernel starts while the one before it is still
running, so neither the profiler's summed kernel times nor the graph replay say what
a kernel boundary costs inside the step (bench/README.md, the decode profile: the sum
exceeds the replay). This script builds nib's CUDA kernels with -DNIB_TRACE
(`NIB_CUDA_TRACE=1`, engine/cuda/common.cuh): thread 0 of every block then records
when the block started, when its `griddepcontrol.wait` returned and when it left
(%globaltimer, one clock for every SM) and its SM. The model is the one
bench/decode.py measures (random init, real shape, the engine's kernel choices and
step tuning); the decode graph is replayed at --position and the records of each
replay are grouped into kernel instances in launch order.

Per kernel of a layer (median over layers and replays), against the traced kernel
before it ("prev", whose last block left at prev_end):

- `interval_us`: prev_end to this kernel's last block leaving: its share of the step;
- `release_us`: prev_end to its first block passing the wait: what the dependency
  itself costs (launch overhead is hidden: the blocks were already resident);
- `after_wait_us`: first block past the wait to the last block leaving;
- `tail_us`: the median block's end to the last block's end;
- `lead_us`: how long before prev_end its first block started (positive: its weight
  loads overlapped prev), and `resident`: the fraction of its blocks that had started
  by prev_end.

Kernels nib does not build (PyTorch's embedding and position ops, Triton's) are not
traced; an interval spanning one says so (`after` names the traced kernel before).
The tracing costs each block an atomic and a 64-byte store: `replay_us` is the traced
graph's replay time, to be read against bench/decode.py's untraced one.

The INT4 GEMVs and the attention also mark points of their own after the wait
(NIB_TRACE_MARK, thread 0's clock): `phases` names what lies between the wait, each
mark and the end (PHASES: for a GEMV staging the activations, streaming its weights,
the reduction and epilogue), with `phase_us_median` for the kernel's median block and
`phase_us_last_block` for the block that ended last, the one the next kernel waits for.

Writes bench/results/<date>-step-timeline.json (date, device, torch, command, rows;
`--tag T`: <date>-step-timeline-T.json). `--force KNOB=LABEL` runs a chosen config for a
layer shape after the step tuning, to see what it does to its neighbours.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import itertools
import math
import os
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import write_result

KINDS = {1: "w4a16", 2: "w4a16-bulk", 3: "gemv16", 4: "attention", 5: "greedy", 6: "embed"}
RECORD = np.dtype(
    [
        ("start", "<u8"),
        ("waited", "<u8"),
        ("end", "<u8"),
        ("marks", "<u8", (3,)),
        ("smid", "<u4"),
        ("kind", "<u4"),
        ("grid", "<u4"),
        ("threads", "<u4"),
    ]
)  # fmt: skip  (common.cuh's NibTraceRecord)
CAPACITY = 1 << 16  # NIB_TRACE_CAPACITY
# What the time between a kernel's wait, its NIB_TRACE_MARKs (thread 0's) and its end
# is, by kind (w4a16.cu, attention.cu); the other kernels mark nothing.
PHASES: dict[int, tuple[str, ...]] = {
    1: ("stage x", "stream weights", "reduce + epilogue"),
    2: ("stage x", "stream weights", "reduce + epilogue"),
    4: ("rope + q", "attend tiles", "merge warps", "merge splits + store"),
}
# A small model of the Llama family's structure, for tests/gpu (seconds, not minutes).
TEST_SHAPES: dict[str, dict[str, object]] = {
    "tiny-llama": dict(
        model_type="llama",
        vocab_size=32000,
        hidden_size=1024,
        intermediate_size=2816,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=8,
        max_position_embeddings=4096,
        rope_theta=10000.0,
        tie_word_embeddings=False,
    ),
}
FIRST_ROLES = ("embed",)
LAYER_ROLES = ("qkv", "attention", "o_proj", "gate_up", "down")
FINAL_ROLES = ("lm_head", "greedy")


@dataclass
class Instance:
    """One launch: its blocks' records (ns)."""

    module: str
    kind: int
    grid: int
    threads: int
    starts: list[int] = field(default_factory=list)
    waits: list[int] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)
    sms: set[int] = field(default_factory=set)
    # Per block: (waited, its marks, end); 0 for a point the block never reached.
    blocks: list[tuple[int, tuple[int, ...], int]] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{KINDS.get(self.kind, self.kind)} {self.grid}x{self.threads}"

    @property
    def complete(self) -> bool:
        return len(self.starts) == self.grid


def group_instances(records: list[tuple[str, np.ndarray]]) -> list[Instance]:
    """Records of one replay -> kernel instances in launch order. A launch's blocks all
    start before any block of a later launch of the same kernel and grid (that launch
    waits, through the launches between, for every block of this one to have started),
    so blocks join the open instance of their (module, kind, grid, threads) until it
    holds `grid` blocks."""
    rows = []
    for module, recs in records:
        for r in recs:
            rows.append((int(r["start"]), module, r))
    rows.sort(key=lambda t: t[0])
    open_: dict[tuple[str, int, int, int], Instance] = {}
    out: list[Instance] = []
    for start, module, r in rows:
        key = (module, int(r["kind"]), int(r["grid"]), int(r["threads"]))
        inst = open_.get(key)
        if inst is None or inst.complete:
            inst = open_[key] = Instance(*key)
            out.append(inst)
        inst.starts.append(start)
        if int(r["waited"]):
            inst.waits.append(int(r["waited"]))
        inst.ends.append(int(r["end"]))
        inst.sms.add(int(r["smid"]))
        inst.blocks.append((int(r["waited"]), tuple(int(m) for m in r["marks"]), int(r["end"])))
    return out


def block_phases(waited: int, marks: tuple[int, ...], end: int) -> list[float] | None:
    """µs from a block's wait through each of its marks to its end (marks in order, up to
    the first it did not reach); None if it never waited."""
    if not waited:
        return None
    points = [waited]
    for m in marks:
        if not m:
            break
        points.append(m)
    points.append(end)
    return [(b - a) / 1e3 for a, b in itertools.pairwise(points)]


def phase_stats(inst: Instance) -> dict[str, object]:
    """The kernel's phases (PHASES) after its wait: the median over its blocks that passed
    every mark, and the last block to end (the one the next kernel waits for)."""
    names = PHASES.get(inst.kind)
    if not names:
        return {}
    per = [p for p in (block_phases(*b) for b in inst.blocks) if p and len(p) == len(names)]
    if not per:
        return {}
    last = block_phases(*max(inst.blocks, key=lambda b: b[2]))
    return {
        "phases": list(names),
        "phase_us_median": [statistics.median(col) for col in zip(*per, strict=True)],
        "phase_us_last_block": last if last and len(last) == len(names) else None,
    }


def roles(instances: list[Instance], layers: int) -> list[str]:
    """The step's kernels by name where the count says which is which (the embedding
    lookup where it is nib's kernel, five traced kernels a layer, then the lm_head and
    the greedy pick), else by kind and grid."""
    body = [LAYER_ROLES[i % len(LAYER_ROLES)] for i in range(len(LAYER_ROLES) * layers)]
    if not instances:
        return []
    first = list(FIRST_ROLES) if KINDS.get(instances[0].kind) == "embed" else []
    # Where the pick is folded into the INT4 lm_head (GraphRunner.fuse_pick), the step
    # ends with the lm_head.
    final = list(FINAL_ROLES) if KINDS.get(instances[-1].kind) == "greedy" else ["lm_head"]
    if len(instances) == len(first) + len(body) + len(final):
        return first + body + final
    return [i.label for i in instances]


def boundaries(instances: list[Instance], names: list[str]) -> list[dict[str, float]]:
    """Per instance after the first: its timing against the traced instance before it (µs)."""
    out = []
    for prev, cur, name in zip(instances, instances[1:], names[1:], strict=False):
        prev_end = max(prev.ends)
        first_wait = min(cur.waits) if cur.waits else min(cur.starts)
        ends = sorted(cur.ends)
        out.append(
            {
                "role": name,
                "kernel": cur.label,
                "after": prev.label,
                "interval_us": (ends[-1] - prev_end) / 1e3,
                "release_us": (first_wait - prev_end) / 1e3,
                "after_wait_us": (ends[-1] - first_wait) / 1e3,
                "tail_us": (ends[-1] - ends[len(ends) // 2]) / 1e3,
                "lead_us": (prev_end - min(cur.starts)) / 1e3,
                "resident": sum(s < prev_end for s in cur.starts) / len(cur.starts),
                "blocks": len(cur.starts),
                "sms": len(cur.sms),
                "complete": cur.complete,
                **phase_stats(cur),
            }
        )
    return out


SUMMARY_KEYS = ("interval_us", "release_us", "after_wait_us", "tail_us", "lead_us", "resident")


def summarise(per_replay: list[list[dict[str, float]]]) -> list[dict[str, object]]:
    """Medians per role over layers and replays, in the step's order of first appearance."""
    by_role: dict[str, list[dict[str, float]]] = {}
    for replay in per_replay:
        for b in replay:
            by_role.setdefault(str(b["role"]), []).append(b)
    out: list[dict[str, object]] = []
    for role, items in by_role.items():
        row: dict[str, object] = {
            "role": role,
            "kernel": str(items[0]["kernel"]),
            "count_per_step": len(items) / len(per_replay),
        }
        for k in SUMMARY_KEYS:
            row[k] = statistics.median(float(b[k]) for b in items)
        row["interval_us_per_step"] = sum(float(b["interval_us"]) for b in items) / len(per_replay)
        row["blocks"] = items[0]["blocks"]
        row["sms"] = statistics.median(int(b["sms"]) for b in items)
        phased = [b for b in items if b.get("phases")]
        if phased:
            row["phases"] = phased[0]["phases"]
            for key in ("phase_us_median", "phase_us_last_block"):
                cols = [b[key] for b in phased if b.get(key)]
                if cols:
                    row[key] = [statistics.median(c) for c in zip(*cols, strict=True)]
        out.append(row)
    return out


def tick_ns(records: list[tuple[str, np.ndarray]]) -> int:
    """The clock's step: the gcd of the stamps' distances from the first (1 if ns)."""
    stamps = np.concatenate([np.concatenate([r["start"], r["end"]]) for _, r in records if len(r)])
    base = int(stamps.min())
    g = 0
    for s in stamps[:4096]:
        g = math.gcd(g, int(s) - base)
        if g == 1:
            break
    return g


# ---- reading the buffers (GPU) ------------------------------------------------------


class Tracer:
    """The nib_trace buffers of every traced module loaded on `device`."""

    def __init__(self, device: torch.device) -> None:
        from nib.engine.cuda import driver, loader

        self.driver = driver
        modules = loader.loaded(device, traced=True)
        if not modules:
            raise RuntimeError("no traced nib CUDA module is loaded (NIB_CUDA_TRACE=1?)")
        self.addr = {}
        for m in modules:
            buf, size = m.global_address("nib_trace")
            count, _ = m.global_address("nib_trace_count")
            if size != CAPACITY * RECORD.itemsize:
                raise RuntimeError(
                    f"{m.name}: nib_trace is {size} bytes, expected the "
                    f"{CAPACITY} x {RECORD.itemsize} of common.cuh"
                )
            self.addr[m.name] = (buf, count)

    def reset(self) -> None:
        torch.cuda.synchronize()
        for _, count in self.addr.values():
            rc = self.driver.lib().cuMemsetD32_v2(
                ctypes.c_uint64(count), ctypes.c_uint(0), ctypes.c_size_t(1)
            )
            self.driver.check(rc, "cuMemsetD32(nib_trace_count)")
        torch.cuda.synchronize()

    def read(self) -> list[tuple[str, np.ndarray]]:
        torch.cuda.synchronize()
        out = []
        for name, (buf, count) in self.addr.items():
            n = ctypes.c_uint32()
            self._copy(ctypes.addressof(n), count, 4)
            if n.value > CAPACITY:
                raise RuntimeError(
                    f"{name}: {n.value} blocks overflowed the {CAPACITY}-record buffer"
                )
            recs = np.zeros(n.value, dtype=RECORD)
            if n.value:
                self._copy(recs.ctypes.data, buf, n.value * RECORD.itemsize)
            out.append((name, recs))
        return out

    def _copy(self, host: int, dev: int, nbytes: int) -> None:
        rc = self.driver.lib().cuMemcpyDtoH_v2(
            ctypes.c_void_p(host), ctypes.c_uint64(dev), ctypes.c_size_t(nbytes)
        )
        self.driver.check(rc, "cuMemcpyDtoH(nib_trace)")


def trace_row(
    shape: str,
    fmt: str,
    position: int,
    replays: int,
    forced: list[str] | None = None,
    pick: str = "tuned",
) -> dict[str, object]:
    import decode  # bench/decode.py: the same model, kernels and step tuning

    decode.SHAPES.update(TEST_SHAPES)
    runner, tuned = decode.tuned_runner(shape, fmt == "int4", position + 64)
    model = runner.model
    layers = model.cfg.num_layers
    applied = decode.force_configs(model, forced or [])
    if pick != "tuned":  # else where the step tuning put the greedy pick
        runner.fuse_pick = pick == "fused"
    runner.capture()
    name = runner._decode_name(0, True)
    graph = runner.graphs[name]
    tracer = Tracer(torch.device("cuda"))
    per_replay, replay_us, complete = [], [], True
    first: list[tuple[str, np.ndarray]] = []
    with torch.cuda.stream(runner.stream):
        for r in range(replays + 1):
            tracer.reset()
            runner.pos.fill_(position)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            records = tracer.read()
            if r == 0:  # warm-up
                first = records
                continue
            replay_us.append(start.elapsed_time(end) * 1e3)
            inst = group_instances(records)
            complete &= all(i.complete for i in inst)
            names = roles(inst, layers)
            per_replay.append(boundaries(inst, names))
            span_us = (max(max(i.ends) for i in inst) - min(min(i.starts) for i in inst)) / 1e3
    summary = summarise(per_replay)
    row = {
        "shape": shape,
        "format": fmt,
        "position": position,
        "replays": replays,
        "layers": layers,
        "traced_kernels_per_step": len(per_replay[0]) + 1,
        "all_instances_complete": complete,
        "replay_us_median": statistics.median(replay_us),
        "traced_span_us_last": span_us,
        "clock_tick_ns": tick_ns(first),
        "step_tuning": getattr(runner, "step_tuning", tuned),
        "forced": applied,
        "pick_fused": runner.pick_fused,
        "roles": summary,
        "layer_boundaries_last_replay": per_replay[-1],
    }
    del runner, model, graph
    gc.collect()
    torch.cuda.empty_cache()
    return row


def table(rows: list[dict[str, object]]) -> list[str]:
    lines = [
        "| shape | format | kernel | per step | interval µs | release µs | after wait µs | tail µs "
        "| lead µs | resident | step share µs |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        for r in row["roles"]:  # type: ignore[attr-defined]
            lines.append(
                f"| {row['shape']} | {row['format']} | {r['role']} | {r['count_per_step']:.0f} "
                f"| {r['interval_us']:.2f} | {r['release_us']:.2f} | {r['after_wait_us']:.2f} "
                f"| {r['tail_us']:.2f} | {r['lead_us']:.2f} | {r['resident']:.2f} "
                f"| {r['interval_us_per_step']:.0f} |"
            )
    return lines


def phase_table(rows: list[dict[str, object]]) -> list[str]:
    """Per kernel that marks its phases: µs from its wait through each phase, for its
    median block and for its last block to end (medians over layers and replays)."""
    lines = [
        "| shape | format | kernel | phases | median block µs | last block µs |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        for r in row["roles"]:  # type: ignore[attr-defined]
            if "phase_us_median" not in r:
                continue
            last = r.get("phase_us_last_block")
            lines.append(
                f"| {row['shape']} | {row['format']} | {r['role']} | {' / '.join(r['phases'])} "
                f"| {' / '.join(f'{v:.2f}' for v in r['phase_us_median'])} "
                f"| {' / '.join(f'{v:.2f}' for v in last) if last else '-'} |"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--shapes", default="llama-2-7b,qwen2.5-coder-1.5b")
    ap.add_argument("--formats", default="int4,bf16", help="int4 (fp16 activations) and/or bf16")
    ap.add_argument("--position", type=int, default=576, help="the decode position replayed")
    ap.add_argument("--replays", type=int, default=20, help="traced replays (after one warm-up)")
    ap.add_argument(
        "--force",
        action="append",
        default=[],
        metavar="KNOB=LABEL",
        help="after the step tuning, run this config for a layer shape (repeatable), e.g. "
        "'int4 4096x4096 +residual=int4 mma16 r1w8p2'",
    )
    ap.add_argument(
        "--pick",
        choices=("tuned", "fused", "separate"),
        default="tuned",
        help="the greedy pick: where start-up left it (a kernel of its own unless tuned "
        "otherwise), folded into the INT4 lm_head's epilogue where it can be, or a kernel of "
        "its own after the lm_head",
    )
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--tag", default="", help="write <date>-step-timeline-<tag>.json instead")
    args = ap.parse_args(argv)
    if args.replays < 1:
        ap.error("--replays must be at least 1")
    if not torch.cuda.is_available():
        print("step_timeline.py needs a CUDA GPU", file=sys.stderr)
        return 2
    os.environ["NIB_CUDA_TRACE"] = "1"  # before any nib CUDA module is loaded
    rows = []
    for shape in args.shapes.split(","):
        for fmt in args.formats.split(","):
            if fmt not in ("int4", "bf16"):
                ap.error(f"--formats: {fmt!r} is not int4 or bf16")
            print(f"== {shape} {fmt}", flush=True)
            row = trace_row(shape, fmt, args.position, args.replays, args.force, args.pick)
            rows.append(row)
            print(
                f"   replay {row['replay_us_median']:.1f} us traced, clock tick {row['clock_tick_ns']} ns, "
                f"{row['traced_kernels_per_step']} traced kernels",
                flush=True,
            )
            if args.out:  # what has been measured survives a later row's failure
                name = f"step-timeline-{args.tag}" if args.tag else "step-timeline"
                write_result(args.out, name, "step_timeline.py", {"rows": rows})
    print("\n".join(table(rows)))
    print("\n".join(phase_table(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
