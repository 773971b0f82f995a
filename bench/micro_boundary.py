"""What a kernel boundary costs on this GPU: the floor under a kernel-per-op decode step.

    python3 bench/micro_boundary.py --out bench/results

A decode step is ~150 small dependent kernels (bench/README.md, the decode profile).
engine/cuda/probe.cu's probe_stream is the least such a kernel can be: each block
streams its share of S bytes (16-byte loads, 8 in flight per thread, issued before
griddepcontrol.wait as nib's GEMVs issue their weight loads), sums them, and adds the
previous launch's output to its own (the data dependency one layer has on the one
before). Timed back to back inside one CUDA graph (bench-wide habit: median of
replays, per call), with and without programmatic dependent launch, for grids of 132
to 1056 blocks of 256 threads and S from 0 (a pure boundary: wait, read, write) to
32 MB. Every call reads a different region of one 512 MB buffer, so nothing sits
in the 60 MiB L2.

With --phases P it also times probe_phases: the same work as P launches, in one
persistent launch whose blocks meet at a grid-wide barrier between phases (--barriers:
"gen", an atomic count whose last arriver publishes a generation word; "count", a
monotonic count every block polls; "flags", a release-stored counter per block that
every block's first warp polls), the next phase's loads issued before the wait; every output is checked against the data (a barrier that lets a block
through early gives a wrong sum), and a wait that spins too long is reported, not hung
on. Per phase against per launch: what replacing kernel boundaries by grid barriers
in one persistent decode kernel would save.

With --ring KB[,KB...] it also times probe_ring: a persistent kernel in which one
warp of every block streams the block's share of every phase into a ring of KB of
shared memory by bulk copies, running ahead across phases (a decode step's weights do
not depend on its activations), while the other warps wait at a grid barrier for the
previous phase, read its output and consume the ring. As uniform phases beside the
other barriers (barrier "ring-<KB>kb"), and with --steps, on the bytes of a whole INT4
decode step of bench/decode.py's shapes: each layer's dependent stages (q/k/v, the
attention's K and V rows at context 640 or 4096, o_proj, gate_up, down; LAYERS) and
the lm_head, against a chain of probe_stream launches with programmatic dependent
launch over the same bytes (what a kernel-per-op step pays at the least, before any
arithmetic) and the bytes' floor. --ring-modes adds diagnostics (no grid barrier, no
reading of the ring) and --trace stamps each phase (%globaltimer), so a step's time
splits into its stages. What a whole-step persistent kernel would be worth, before
anyone writes one. --steps without --ring times the chains alone.

With --merges (sets of a layer's consecutive stages, e.g. "gate_up+down" or
"qkv+attention,gate_up+down") the chain is timed again with each group as one phase
over the group's bytes: a step with fewer dependent ops a layer, e.g. an MLP whose
blocks each own a slice of the intermediate (gate_up then down on that slice, no
boundary between them), or an attention that starts on each KV head's q/k/v rows as
they are written. That is a bound: what the fused kernel must do besides streaming is
not in it, except that --red adds the partial sums such an MLP must reduce: every
block of the phase holding "down" adds to hidden-size words in global memory ("u64":
fixed-point `red.add.u64`, deterministic; "f32": `red.add.v4.f32`), or, with
--red-cluster C, each block to its own 1/C of them, as the blocks of a cluster of C that
summed their partials in shared memory first (that sum is not in it), so that a word
takes blocks / C additions instead of one from every block.

Fit per grid and launch mode: t(S) = a + S / b, least squares over S > 0; `a` is the
fixed cost per kernel (launch, ramp, tail, the wait for the previous kernel), `b`
the streaming rate. Napkin math: the copy bandwidth (~4.2 TB/s) gives b; a
Qwen2.5-1.5B decode step has 144 kernels, so every microsecond of `a` is ~0.14 ms
a token, against a 0.73 ms floor (bf16).
Writes bench/results/<date>-micro-boundary.json (date, device, torch, command,
copy_bandwidth_gbps, rows, fits, phase_rows with --phases, step_rows with --steps:
impl, blocks, us_per_step, floor_us_per_step, and merge / red / red_cluster / correct on
the merged and reducing rows).
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import copy_bandwidth_gbps, write_result
from decode import SHAPES

from nib.engine.cuda.timing import graph_us

BLOCKS = (132, 264, 528, 1056)
MBYTES = (0.0, 0.5, 2.0, 8.0, 32.0)
THREADS = 256
# probe.cu's grid barriers: the kernel that uses each one.
BARRIERS = {"gen": "probe_phases", "count": "probe_phases_count", "flags": "probe_phases_flags"}
POOL_BYTES = 512 << 20  # >> 60 MiB of L2
L2_BYTES = 60 << 20
RING_THREADS = 288  # probe.cu: 8 consumer warps and the producer warp
RING_MAX_STAGES = 64


def int4_linear_bytes(inputs: int, outputs: int) -> int:
    """Weights at 4 bits and fp16 scales of group 128: what an INT4 linear streams."""
    return inputs * outputs // 2 + inputs // 128 * outputs * 2


def bf16_linear_bytes(inputs: int, outputs: int) -> int:
    return inputs * outputs * 2


LINEAR_BYTES = {"int4": int4_linear_bytes, "bf16": bf16_linear_bytes}


# A decode layer's dependent stages, in order (layer_stages gives their bytes).
STAGES = ("qkv", "attention", "o_proj", "gate_up", "down")


def layer_stages(
    shape: dict[str, object], context: int, fmt: str = "int4"
) -> tuple[tuple[str, int], ...]:
    """One decode layer's dependent stages and the bytes each reads with `fmt` weights:
    q/k/v, the attention's K and V rows at `context` (16-bit), o_proj, gate_up, down."""
    linear = LINEAR_BYTES[fmt]
    h, i = int(shape["hidden_size"]), int(shape["intermediate_size"])  # type: ignore[call-overload]
    heads, kv = int(shape["num_attention_heads"]), int(shape["num_key_value_heads"])  # type: ignore[call-overload]
    d = h // heads
    return (
        ("qkv", linear(h, (heads + 2 * kv) * d)),
        ("attention", context * kv * d * 2 * 2),
        ("o_proj", linear(h, h)),
        ("gate_up", linear(h, 2 * i)),
        ("down", linear(i, h)),
    )


# bench/decode.py's shapes and weight formats at its contexts (prompt 512 + 128 decoded;
# 4K): layer count, stages. The step adds the lm_head (step_bytes).
LAYERS = {
    f"{name}-{fmt}{suffix}": (int(shape["num_hidden_layers"]), layer_stages(shape, ctx, fmt))  # type: ignore[call-overload]
    for name, shape in SHAPES.items()
    for fmt in LINEAR_BYTES
    for suffix, ctx in (("", 640), ("-4k", 4096))
}


def step_shape(name: str) -> tuple[dict[str, object], str]:
    """The model shape and weight format of LAYERS[name] ("qwen2.5-coder-1.5b-int4-4k")."""
    shape_name, fmt = name.removesuffix("-4k").rsplit("-", 1)
    return SHAPES[shape_name], fmt


def step_phases(name: str) -> tuple[list[str], list[int]]:
    """A whole decode step of LAYERS[name] as phases: labels and bytes (the lm_head last)."""
    count, stages = LAYERS[name]
    shape, fmt = step_shape(name)
    lm_head = LINEAR_BYTES[fmt](int(shape["hidden_size"]), int(shape["vocab_size"]))  # type: ignore[call-overload]
    return [s for s, _ in stages] * count + ["lm_head"], [n for _, n in stages] * count + [lm_head]


class PhaseArgs(ctypes.Structure):
    _fields_ = [
        ("src", ctypes.c_void_p),
        ("out", ctypes.c_void_p),
        ("count", ctypes.c_void_p),
        ("gen", ctypes.c_void_p),
        ("err", ctypes.c_void_p),
        ("region", ctypes.c_longlong),
        ("wrap", ctypes.c_longlong),
        ("flags", ctypes.c_void_p),
        ("per_block", ctypes.c_int),
        ("phases", ctypes.c_int),
        ("spin_limit", ctypes.c_int),
    ]


class ProbeArgs(ctypes.Structure):
    _fields_ = [
        ("src", ctypes.c_void_p),
        ("prev", ctypes.c_void_p),
        ("out", ctypes.c_void_p),
        ("per_block", ctypes.c_int),
        ("red", ctypes.c_void_p),
        ("red_words", ctypes.c_int),
        ("red_spread", ctypes.c_int),
    ]


# probe.cu's reducing probes: the kernel and the bytes of one word.
RED_KERNELS = {"u64": ("probe_stream_red_u64", 8), "f32": ("probe_stream_red_f32", 4)}


def parse_merges(spec: str) -> list[tuple[tuple[str, ...], ...]]:
    """--merges: sets separated by ';', each a comma-separated list of groups of a layer's
    consecutive stages joined by '+' ("gate_up+down;qkv+attention,gate_up+down")."""
    order = list(STAGES)
    sets = []
    for text in (t.strip() for t in spec.split(";")):
        if not text:
            continue
        groups: list[tuple[str, ...]] = []
        for g in text.split(","):
            names = tuple(n.strip() for n in g.split("+"))
            if len(names) < 2 or any(n not in order for n in names):
                raise ValueError(
                    f"--merges: {g!r} is not two or more of {', '.join(order)} joined by '+'"
                )
            at = order.index(names[0])
            if list(names) != order[at : at + len(names)]:
                raise ValueError(
                    f"--merges: {g!r} must name consecutive stages in order ({' -> '.join(order)})"
                )
            if any(n in done for n in names for done in groups):
                raise ValueError(f"--merges: a stage of {g!r} is in two groups of {text!r}")
            groups.append(names)
        sets.append(tuple(groups))
    return sets


def merge_label(groups: tuple[tuple[str, ...], ...]) -> str:
    return ",".join("+".join(g) for g in groups)


def merged_phases(name: str, groups: tuple[tuple[str, ...], ...]) -> tuple[list[str], list[int]]:
    """step_phases(name) with each group of a layer's stages as one phase (their bytes
    summed): the same step with fewer dependent ops a layer."""
    count, stages = LAYERS[name]
    first = {g[0]: g for g in groups}
    inside = {n for g in groups for n in g}
    sizes_of = dict(stages)
    layer: list[tuple[str, int]] = []
    for stage, n in stages:
        if stage in first:
            g = first[stage]
            layer.append(("+".join(g), sum(sizes_of[x] for x in g)))
        elif stage not in inside:
            layer.append((stage, n))
    labels, sizes = step_phases(name)
    return [s for s, _ in layer] * count + [labels[-1]], [n for _, n in layer] * count + [sizes[-1]]


class RingArgs(ctypes.Structure):
    _fields_ = [
        ("src", ctypes.c_void_p),
        ("out", ctypes.c_void_p),
        ("count", ctypes.c_void_p),
        ("err", ctypes.c_void_p),
        ("offs", ctypes.c_void_p),
        ("per_block", ctypes.c_void_p),
        ("phases", ctypes.c_int),
        ("chunk_vecs", ctypes.c_int),
        ("stages", ctypes.c_int),
        ("spin_limit", ctypes.c_int),
        ("mode", ctypes.c_int),
        ("stamps", ctypes.c_void_p),
    ]


RING_MODES = {"": 0, "no-barrier": 1, "no-read": 2, "no-barrier-no-read": 3}  # probe.cu RING_*


def calls_for(nbytes: int) -> int:
    """Calls per graph: enough distinct regions that the graph touches more than L2."""
    if nbytes == 0:
        return 200
    return max(40, min(400, -(-2 * L2_BYTES // nbytes)))


def time_case(kernel, pool: torch.Tensor, blocks: int, nbytes: int, pdl: bool) -> float:  # type: ignore[no-untyped-def]
    per_block = nbytes // 16 // blocks
    region = per_block * blocks * 16
    calls = calls_for(region)
    slots = max(1, min(calls, POOL_BYTES // max(region, 1)))
    outs = [torch.zeros(blocks, device="cuda") for _ in range(2)]
    fns = []
    for i in range(calls):
        src = pool.data_ptr() + (i % slots) * region
        args = ProbeArgs(src, outs[i % 2].data_ptr(), outs[(i + 1) % 2].data_ptr(), per_block)
        fns.append(lambda a=args: kernel.launch((blocks,), (THREADS,), a, 128, pdl=pdl))
    return graph_us(fns, calls=calls)


def resident_blocks(kernel, threads: int, shared: int) -> int:  # type: ignore[no-untyped-def]
    """Blocks of `kernel` that fit on one SM at once (cuOccupancyMaxActiveBlocksPerMultiprocessor)."""
    from nib.engine.cuda.driver import check, lib

    n = ctypes.c_int()
    check(
        lib().cuOccupancyMaxActiveBlocksPerMultiprocessor(
            ctypes.byref(n), kernel.handle, threads, ctypes.c_size_t(shared)
        ),
        "cuOccupancyMaxActiveBlocksPerMultiprocessor",
    )
    return int(n.value)


def expected_phases(
    pool: torch.Tensor, blocks: int, per_block: int, phases: int, region: int, wrap: int
) -> torch.Tensor:
    """What probe_phases must write: [phases, blocks] (probe_ring's sums, equal phases)."""
    offs = [(ph * region) % wrap for ph in range(phases)]
    return expected_ring(pool, blocks, [per_block] * phases, offs)


def time_phases(kernel, pool: torch.Tensor, blocks: int, nbytes: int, phases: int) -> dict:  # type: ignore[no-untyped-def,type-arg]
    per_block = nbytes // 16 // blocks
    region = per_block * blocks
    pool_vecs = pool.numel() // 4
    wrap = (pool_vecs // region) * region if region else 1
    out = torch.zeros(phases, blocks, device="cuda")
    state = torch.zeros(2, dtype=torch.int32, device="cuda")  # count, generation
    flags = torch.zeros(blocks, dtype=torch.int32, device="cuda")
    err = torch.zeros(1, dtype=torch.int32, device="cuda")
    args = PhaseArgs(
        pool.data_ptr(), out.data_ptr(), state.data_ptr(), state.data_ptr() + 4,
        err.data_ptr(), region, wrap, flags.data_ptr(), per_block, phases, 1 << 22,
    )  # fmt: skip
    kernel.launch((blocks,), (THREADS,), args, 128)  # warm; no PDL: it waits for nothing
    torch.cuda.synchronize()
    ok = bool(err.item() == 0) and torch.equal(
        out.double(), expected_phases(pool, blocks, per_block, phases, region, wrap)
    )
    times = []
    for _ in range(7):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        kernel.launch((blocks,), (THREADS,), args, 128)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / phases)
    ok = ok and err.item() == 0
    return {"us_per_phase": statistics.median(times), "correct": ok}


def phase_layout(pool: torch.Tensor, blocks: int, sizes: list[int]) -> tuple[list[int], list[int]]:
    """Phases of `sizes` bytes over `blocks` blocks: each block's 16-byte vectors per phase,
    and each phase's first vector in the pool, the regions consecutive and back to the
    pool's start when the next would not fit (so no phase's data is still in L2)."""
    per_block = [n // 16 // blocks for n in sizes]
    offs, at = [], 0
    for n in per_block:
        if at + n * blocks > pool.numel() // 4:
            at = 0
        offs.append(at)
        at += n * blocks
    return per_block, offs


def expected_ring(
    pool: torch.Tensor, blocks: int, per_block: list[int], offs: list[int]
) -> torch.Tensor:
    """What probe_ring must write: [phases, blocks] (phase sizes may differ)."""
    words = pool.view(-1, 4)
    out = torch.zeros(len(per_block), blocks, dtype=torch.float64, device=pool.device)
    for ph, (n, off) in enumerate(zip(per_block, offs, strict=True)):
        v = words[off : off + blocks * n].reshape(blocks, n, 4)
        s = ((v[..., 0] & 1) + (v[..., 3] & 1)).sum(-1).double()
        out[ph] = s + (out[ph - 1].roll(-1) if ph else 0)
    return out


def ring_blocks(kernel, ring_bytes: int) -> int:  # type: ignore[no-untyped-def]
    """Blocks of probe_ring that are resident at once with a ring of `ring_bytes`."""
    kernel.allow_shared(ring_bytes)
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    return resident_blocks(kernel, RING_THREADS, ring_bytes) * sms


def ring_trace(stamps: torch.Tensor, labels: list[str]) -> dict[str, dict[str, float]]:
    """Where a probe_ring launch's phases went, from its [phases, blocks, 2] stamps (ns:
    barrier passed, arrived at the next), per label (a layer's stage), medians over the
    label's phases after the first: `span_us` from the previous phase's last arrival to
    this one's, `release_us` from that last arrival to the median block passing this
    phase's barrier, `work_us` the median block's time from passing to arriving,
    `tail_us` the median block's arrival to the last one's."""
    t = stamps.double().cpu() / 1e3
    passed, arrived = t[..., 0], t[..., 1]
    last = arrived.max(dim=1).values
    groups: dict[str, dict[str, list[float]]] = {
        label: {"span_us": [], "release_us": [], "work_us": [], "tail_us": []}
        for label in dict.fromkeys(labels)  # in the order the phases first come
    }
    for ph in range(1, t.shape[0]):
        g = groups[labels[ph]]
        g["span_us"].append(float(last[ph] - last[ph - 1]))
        g["release_us"].append(float(passed[ph].median() - last[ph - 1]))
        g["work_us"].append(float((arrived[ph] - passed[ph]).median()))
        g["tail_us"].append(float(last[ph] - arrived[ph].median()))
    return {
        k: {m: statistics.median(v) for m, v in g.items()}
        for k, g in groups.items()
        if g["span_us"]
    }


def time_ring(  # type: ignore[no-untyped-def]
    kernel,
    pool: torch.Tensor,
    blocks: int,
    sizes: list[int],
    ring_bytes: int,
    chunk_bytes: int,
    mode: int = 0,
    labels: list[str] | None = None,
) -> dict:  # type: ignore[type-arg]
    """probe_ring over phases of `sizes` bytes: µs per launch, and whether every output
    was right in the launch checked (the first) and no barrier wait gave up in any (a
    diagnostic `mode` is not checked: "correct" is then None). With `labels` (one per
    phase), one more launch records when each block passed each barrier (`trace`:
    ring_trace's)."""
    stages = min(RING_MAX_STAGES, ring_bytes // chunk_bytes)
    if stages < 1:
        raise ValueError(f"a ring of {ring_bytes} bytes holds no chunk of {chunk_bytes}")
    per_block, offs = phase_layout(pool, blocks, sizes)
    dev = pool.device
    per_t = torch.tensor(per_block, dtype=torch.int32, device=dev)
    offs_t = torch.tensor(offs, dtype=torch.int64, device=dev)
    out = torch.full((len(sizes), blocks), float("nan"), device=dev)  # poisoned
    count = torch.zeros(1, dtype=torch.int32, device=dev)
    err = torch.zeros(1, dtype=torch.int32, device=dev)
    args = RingArgs(
        pool.data_ptr(), out.data_ptr(), count.data_ptr(), err.data_ptr(), offs_t.data_ptr(),
        per_t.data_ptr(), len(sizes), chunk_bytes // 16, stages, 1 << 22, mode, None,
    )  # fmt: skip
    shared = stages * chunk_bytes
    kernel.launch((blocks,), (RING_THREADS,), args, shared)
    torch.cuda.synchronize()
    ok: bool | None = None
    if not mode:
        ok = bool(err.item() == 0) and torch.equal(
            out.double(), expected_ring(pool, blocks, per_block, offs)
        )
    us = graph_us([lambda: kernel.launch((blocks,), (RING_THREADS,), args, shared)], calls=2)
    if ok is not None:
        ok = ok and err.item() == 0
    trace = None
    if labels:
        stamps = torch.zeros(len(sizes), blocks, 2, dtype=torch.int64, device=dev)
        args.stamps = stamps.data_ptr()
        kernel.launch((blocks,), (RING_THREADS,), args, shared)
        torch.cuda.synchronize()
        trace = ring_trace(stamps, labels)
    return {
        "us_per_launch": us,
        "correct": ok,
        "mode": mode,
        "trace": trace,
        "bytes": sum(n * 16 * blocks for n in per_block),
        "stages": stages,
        "chunk_bytes": chunk_bytes,
        "ring_bytes": shared,
    }


def _fmt_trace(tr: dict[str, float]) -> str:
    return "  ".join(f"{k[:-3]} {v:6.2f}" for k, v in tr.items())


def time_chain(  # type: ignore[no-untyped-def]
    kernel,
    pool: torch.Tensor,
    blocks: int,
    sizes: list[int],
    red: tuple[object, int] | None = None,
    red_words: list[int] | None = None,
    red_spread: int = 1,
) -> float:
    """µs for one pass of probe_stream launches over `sizes` (PDL, one CUDA graph). With
    `red` (a reducing probe kernel, bytes a word), phase i runs that kernel instead and
    every block adds to red_words[i] words (none where it is 0), blocks b and b + red_spread
    to the same ones."""
    per_block, offs = phase_layout(pool, blocks, sizes)
    outs = [torch.zeros(blocks, device=pool.device) for _ in range(2)]
    words = red_words or [0] * len(sizes)
    buf = torch.zeros(max(max(words), 1) * red_spread * (red[1] if red else 4),
                      dtype=torch.uint8, device=pool.device)  # fmt: skip
    fns = []
    for i, (n, off) in enumerate(zip(per_block, offs, strict=True)):
        args = ProbeArgs(
            pool.data_ptr() + off * 16, outs[i % 2].data_ptr(), outs[(i + 1) % 2].data_ptr(), n,
            buf.data_ptr(), words[i], red_spread,
        )  # fmt: skip
        k = red[0] if red and words[i] else kernel
        fns.append(lambda a=args, k=k: k.launch((blocks,), (THREADS,), a, 128, pdl=True))
    return graph_us(fns) * len(fns)


def red_reference(blocks: int, words: int, spread: int) -> torch.Tensor:
    """What one launch of a reducing probe leaves in zeroed words: [spread, words], row j
    the sum of b + 1 over the blocks b with b % spread == j."""
    sums = [sum(b + 1 for b in range(j, blocks, spread)) for j in range(spread)]
    return torch.tensor(sums, dtype=torch.float64)[:, None].expand(spread, words)


def check_red(kernel, word_bytes: int, blocks: int, words: int, spread: int = 1) -> bool:  # type: ignore[no-untyped-def]
    """One launch of a reducing probe on zeroed (NaN-free) words against red_reference."""
    dtype = torch.int64 if word_bytes == 8 else torch.float32
    buf = torch.zeros(spread, words, dtype=dtype, device="cuda")
    outs = torch.zeros(2, blocks, device="cuda")
    kernel.launch((blocks,), (THREADS,), ProbeArgs(0, outs[0].data_ptr(), outs[1].data_ptr(), 0,
                  buf.data_ptr(), words, spread), 128)  # fmt: skip
    torch.cuda.synchronize()
    return bool(torch.equal(buf.cpu().double(), red_reference(blocks, words, spread)))


def fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """(a us, b GB/s) of t = a + S / b, least squares over (S bytes, t us)."""
    slope, intercept = statistics.linear_regression(*zip(*points, strict=True))
    return intercept, 1e-3 / slope


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    p.add_argument("--phases", type=int, default=0, help="also time probe_phases (e.g. 64)")
    p.add_argument(
        "--barriers",
        default=",".join(BARRIERS),
        help=f"grid barriers for --phases, comma-separated from {','.join(BARRIERS)}",
    )
    p.add_argument(
        "--ring",
        default="",
        help="also time probe_ring with rings of these KB of shared memory (e.g. 96,192)",
    )
    p.add_argument("--chunk-kb", type=int, default=8, help="bytes a ring slot holds, KB")
    p.add_argument(
        "--steps",
        default="",
        help=f"decode steps' bytes, comma-separated from {','.join(LAYERS)} (chains, "
        "and the ring with --ring)",
    )
    p.add_argument(
        "--merges",
        default="",
        help="with --steps: also time the chain with these stages of a layer as one phase; "
        "sets separated by ';', groups by ',', e.g. 'gate_up+down;qkv+attention,gate_up+down'",
    )
    p.add_argument(
        "--red",
        default="",
        help="with --merges: also time each merged set with its phase that holds 'down' "
        f"reducing a hidden-size partial per block, comma-separated from {','.join(RED_KERNELS)}",
    )
    p.add_argument(
        "--red-cluster",
        default="1",
        help="with --red: each block adds its own hidden / C of the words, as the blocks of a "
        "cluster of C whose partials were summed first (not timed); comma-separated values of C",
    )
    p.add_argument(
        "--chain-blocks",
        default="132,264",
        help="grids of the probe_stream chain the --steps rows compare against",
    )
    p.add_argument("--no-sweep", action="store_true", help="skip the per-launch sweep")
    p.add_argument(
        "--linears",
        action="store_true",
        help="time probe_stream on each INT4 linear's bytes (bench/int4_linear.py's layers)",
    )
    p.add_argument(
        "--ring-modes",
        default="",
        help="probe_ring variants, comma-separated from "
        + ", ".join(repr(m) for m in RING_MODES)
        + " ('' the probe itself; the others are diagnostics whose outputs are not checked)",
    )
    p.add_argument("--trace", action="store_true", help="stamp probe_ring's phases (%%globaltimer)")
    args = p.parse_args()
    rings = [int(kb) for kb in args.ring.split(",") if kb]
    for mode in args.ring_modes.split(","):
        if mode not in RING_MODES:
            p.error(f"--ring-modes: {mode!r} is not one of {', '.join(map(repr, RING_MODES))}")
    steps = [name for name in args.steps.split(",") if name]
    for name in steps:
        if name not in LAYERS:
            p.error(f"--steps: {name!r} is not one of {', '.join(LAYERS)}")
    try:
        merges = parse_merges(args.merges)
    except ValueError as e:
        p.error(str(e))
    if merges and not steps:
        p.error("--merges needs --steps")
    reds = [r for r in args.red.split(",") if r]
    for r in reds:
        if r not in RED_KERNELS:
            p.error(f"--red: {r!r} is not one of {', '.join(RED_KERNELS)}")
    if reds and not any("down" in g for m in merges for g in m):
        p.error("--red needs a --merges group that holds 'down'")
    try:
        clusters = [int(c) for c in args.red_cluster.split(",") if c]
    except ValueError:
        clusters = []
    if not clusters or any(c < 1 or c > 16 for c in clusters):
        p.error("--red-cluster: integers from 1 to 16")
    chunk = args.chunk_kb << 10
    if chunk <= 0 or chunk % 16 or any((kb << 10) < chunk for kb in rings):
        p.error("--chunk-kb: a positive number of KB that fits in every --ring")
    if not torch.cuda.is_available():
        print("bench/micro_boundary.py needs a CUDA GPU", file=sys.stderr)
        return 1
    from nib.engine.cuda.loader import module, pdl

    device = torch.device("cuda")
    kernel = module("probe.cu", device).kernel("probe_stream")
    bandwidth = copy_bandwidth_gbps()
    print(f"device-to-device copy bandwidth: {bandwidth:.0f} GB/s", flush=True)
    pool = torch.randint(0, 1 << 30, (POOL_BYTES // 4,), device=device, dtype=torch.int32)
    modes = (True, False) if pdl(device) else (False,)
    rows, fits = [], []
    for blocks in () if args.no_sweep else BLOCKS:
        for use_pdl in modes:
            group = []
            for mb in MBYTES:
                nbytes = int(mb * (1 << 20))
                us = time_case(kernel, pool, blocks, nbytes, use_pdl)
                row = {"blocks": blocks, "pdl": use_pdl, "mbytes": mb, "us_per_call": us}
                if nbytes:
                    row["gbps"] = nbytes / us / 1e3
                group.append(row)
                print(
                    f"  blocks {blocks:5d}  pdl {int(use_pdl)}  {mb:5.1f} MB  {us:8.2f} us"
                    + (f"  {row['gbps']:6.0f} GB/s" if nbytes else ""),
                    flush=True,
                )
            rows += group
            a, b = fit([(r["mbytes"] * (1 << 20), r["us_per_call"]) for r in group if r["mbytes"]])
            empty = group[MBYTES.index(0.0)]["us_per_call"]
            fits.append(
                {
                    "blocks": blocks,
                    "pdl": use_pdl,
                    "fixed_us": a,
                    "stream_gbps": b,
                    "empty_us": empty,
                }
            )
            print(
                f"fit blocks {blocks:5d} pdl {int(use_pdl)}: {a:5.2f} us + S / {b:5.0f} GB/s "
                f"(empty kernel {empty:5.2f} us)",
                flush=True,
            )
    phase_rows: list[dict] = []  # type: ignore[type-arg]
    if args.phases:
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        per_launch = {(r["blocks"], r["mbytes"]): r["us_per_call"] for r in rows if r["pdl"]}
        for barrier in args.barriers.split(","):
            persistent = module("probe.cu", device).kernel(BARRIERS[barrier])
            fit_blocks = resident_blocks(persistent, THREADS, 128) * sms
            for blocks in BLOCKS:
                if blocks > fit_blocks:
                    print(f"  phases: {blocks} blocks do not all fit at once ({fit_blocks})")
                    continue
                for mb in MBYTES:
                    r = time_phases(persistent, pool, blocks, int(mb * (1 << 20)), args.phases)
                    r.update(barrier=barrier, blocks=blocks, mbytes=mb, phases=args.phases,
                             us_per_launch_pdl=per_launch.get((blocks, mb)))  # fmt: skip
                    phase_rows.append(r)
                    print(
                        f"  phases {barrier:5s} blocks {blocks:5d}  {mb:5.1f} MB  "
                        f"{r['us_per_phase']:8.2f} us/phase "
                        f"(a launch: {r['us_per_launch_pdl'] or float('nan'):.2f})  "
                        f"{'ok' if r['correct'] else 'WRONG'}",
                        flush=True,
                    )
    ring_kernel = module("probe.cu", device).kernel("probe_ring") if rings else None
    ring_modes = args.ring_modes.split(",")

    def ring_label(kb: int, mode: str) -> str:
        return f"ring-{kb}kb" + (f"-{mode}" if mode else "")

    def verdict(r: dict) -> str:  # type: ignore[type-arg]
        return {True: "ok", False: "WRONG", None: "(not checked)"}[r["correct"]]

    if args.phases and rings:
        per_launch = {(r["blocks"], r["mbytes"]): r["us_per_call"] for r in rows if r["pdl"]}
        for kb in rings:
            grid = ring_blocks(ring_kernel, kb << 10)
            for mode in ring_modes:
                for mb in MBYTES:
                    sizes = [int(mb * (1 << 20))] * args.phases
                    r = time_ring(ring_kernel, pool, grid, sizes, kb << 10, chunk,
                                  RING_MODES[mode], ["phase"] * len(sizes) if args.trace else None)  # fmt: skip
                    row = {"barrier": ring_label(kb, mode), "blocks": grid, "mbytes": mb,
                           "phases": args.phases, "us_per_phase": r["us_per_launch"] / args.phases,
                           "correct": r["correct"], "stages": r["stages"], "chunk_bytes": chunk,
                           "us_per_launch_pdl": per_launch.get((grid, mb))}  # fmt: skip
                    if r["trace"]:
                        row["trace"] = r["trace"]["phase"]
                    phase_rows.append(row)
                    print(
                        f"  phases {row['barrier']:24s} blocks {grid:5d}  {mb:5.1f} MB  "
                        f"{row['us_per_phase']:8.2f} us/phase  {verdict(r)}"
                        + (f"  {_fmt_trace(row['trace'])}" if r["trace"] else ""),
                        flush=True,
                    )
    step_rows: list[dict] = []  # type: ignore[type-arg]
    red_kernels = {kind: (module("probe.cu", device).kernel(name), word_bytes)
                   for kind, (name, word_bytes) in RED_KERNELS.items() if kind in reds}  # fmt: skip
    red_checked: dict[tuple[str, int, int, int], bool] = {}  # (kind, blocks, words, C)
    for name in steps:
        count, stages = LAYERS[name]
        labels, sizes = step_phases(name)
        lm_head = sizes[-1]
        floor = sum(sizes) / (bandwidth * 1e3)
        base = {"layers": name, "stages": [s for s, _ in stages], "layer_count": count,
                "mbytes_per_layer": sum(n for _, n in stages) / (1 << 20),
                "mbytes_lm_head": lm_head / (1 << 20), "floor_us_per_step": floor}  # fmt: skip
        hidden = int(step_shape(name)[0]["hidden_size"])  # type: ignore[call-overload]
        merged = [(merge_label(groups), *merged_phases(name, groups)) for groups in merges]
        for blocks in [int(b) for b in args.chain_blocks.split(",") if b]:
            us = time_chain(kernel, pool, blocks, sizes)
            step_rows.append(
                {**base, "impl": f"pdl-chain-{blocks}", "blocks": blocks, "us_per_step": us}
            )
            for label, m_labels, m_sizes in merged:
                m_base = {**base, "stages": m_labels[: len(m_labels) // count], "merge": label,
                          "blocks": blocks}  # fmt: skip
                us = time_chain(kernel, pool, blocks, m_sizes)
                step_rows.append({**m_base, "impl": f"pdl-chain-{blocks}-merge[{label}]",
                                  "us_per_step": us})  # fmt: skip
                for kind, red in red_kernels.items():
                    for c in clusters:
                        n = -(-hidden // c // 4) * 4
                        words = [n if "down" in lab.split("+") and "+" in lab else 0
                                 for lab in m_labels]  # fmt: skip
                        key = (kind, blocks, n, c)
                        if key not in red_checked:
                            red_checked[key] = check_red(red[0], red[1], blocks, n, c)
                        us = time_chain(kernel, pool, blocks, m_sizes, red, words, c)
                        step_rows.append({**m_base, "impl": f"pdl-chain-{blocks}-merge[{label}]"
                                          f"-red-{kind}" + (f"-c{c}" if c > 1 else ""),
                                          "red": kind, "red_cluster": c, "red_words": n,
                                          "correct": red_checked[key], "us_per_step": us})  # fmt: skip
        for kb in rings:
            grid = ring_blocks(ring_kernel, kb << 10)
            for mode in ring_modes:
                r = time_ring(ring_kernel, pool, grid, sizes, kb << 10, chunk, RING_MODES[mode],
                              labels if args.trace else None)  # fmt: skip
                row = {**base, "impl": ring_label(kb, mode), "blocks": grid,
                       "us_per_step": r["us_per_launch"], "correct": r["correct"],
                       "stages_in_ring": r["stages"], "chunk_bytes": chunk}  # fmt: skip
                if r["trace"]:
                    row["trace"] = r["trace"]
                step_rows.append(row)
        for r in step_rows:
            if r["layers"] == name:
                print(
                    f"  step {name:28s} {r['impl']:32s} {r['us_per_step']:8.1f} us/step "
                    f"(floor {floor:6.1f}, x{r['us_per_step'] / floor:4.2f})"
                    + ("  WRONG" if r.get("correct", True) is False else ""),
                    flush=True,
                )
                for stage, tr in r.get("trace", {}).items():
                    print(f"      {stage:10s} {_fmt_trace(tr)}", flush=True)
    linear_rows: list[dict] = []  # type: ignore[type-arg]
    layer_sums: dict[str, float] = {}
    if args.linears:
        from int4_linear import LAYERS as INT4_LINEARS  # imports the INT4 kernels: only here

        for shape_name, linears in INT4_LINEARS.items():
            layer_sum = 0.0
            for layer, (k, n) in linears.items():
                nbytes = int4_linear_bytes(k, n)
                by_grid = {b: time_case(kernel, pool, b, nbytes, True) for b in BLOCKS}
                best = min(by_grid, key=by_grid.__getitem__)
                linear_rows.append({"layer": f"{shape_name}.{layer}", "weight_bytes": nbytes,
                                    "us_by_blocks": by_grid, "us_best": by_grid[best],
                                    "blocks_best": best})  # fmt: skip
                if layer != "lm_head":
                    layer_sum += by_grid[best]
                print(
                    f"  linear {shape_name}.{layer:8s} {nbytes / 2**20:7.2f} MiB  "
                    f"{by_grid[best]:6.2f} us at {best} blocks "
                    f"({nbytes / by_grid[best] / 1e3:5.0f} GB/s)",
                    flush=True,
                )
            print(f"  linear {shape_name}: one layer's four {layer_sum:6.2f} us", flush=True)
            layer_sums[shape_name] = layer_sum
    fields = {"copy_bandwidth_gbps": bandwidth, "rows": rows, "fits": fits}
    if linear_rows:
        fields["linear_rows"] = linear_rows
        fields["linear_layer_us"] = layer_sums
    if phase_rows:
        fields["phase_rows"] = phase_rows
    if step_rows:
        fields["step_rows"] = step_rows
    write_result(args.out, "micro-boundary", "micro_boundary.py", fields)
    return 0


if __name__ == "__main__":
    sys.exit(main())
