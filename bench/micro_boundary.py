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

Fit per grid and launch mode: t(S) = a + S / b, least squares over S > 0; `a` is the
fixed cost per kernel (launch, ramp, tail, the wait for the previous kernel), `b`
the streaming rate. Napkin math: the copy bandwidth (~4.2 TB/s) gives b; a
Qwen2.5-1.5B decode step has 144 kernels, so every microsecond of `a` is ~0.14 ms
a token, against a 0.73 ms floor (bf16).
Writes bench/results/<date>-micro-boundary.json (date, device, torch, command,
copy_bandwidth_gbps, rows, fits, and phase_rows with --phases).
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

from nib.engine.cuda.timing import graph_us

BLOCKS = (132, 264, 528, 1056)
MBYTES = (0.0, 0.5, 2.0, 8.0, 32.0)
THREADS = 256
# probe.cu's grid barriers: the kernel that uses each one.
BARRIERS = {"gen": "probe_phases", "count": "probe_phases_count", "flags": "probe_phases_flags"}
POOL_BYTES = 512 << 20  # >> 60 MiB of L2
L2_BYTES = 60 << 20


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
    ]


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
    """What probe_phases must write: [phases, blocks]."""
    words = pool.view(-1, 4)
    out = torch.zeros(phases, blocks, dtype=torch.float64, device=pool.device)
    for ph in range(phases):
        off = (ph * region) % wrap
        v = words[off : off + blocks * per_block].reshape(blocks, per_block, 4)
        s = ((v[..., 0] & 1) + (v[..., 3] & 1)).sum(-1).double()
        out[ph] = s + (out[ph - 1].roll(-1) if ph else 0)
    return out


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
    args = p.parse_args()
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
    for blocks in BLOCKS:
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
    fields = {"copy_bandwidth_gbps": bandwidth, "rows": rows, "fits": fits}
    if phase_rows:
        fields["phase_rows"] = phase_rows
    write_result(args.out, "micro-boundary", "micro_boundary.py", fields)
    return 0


if __name__ == "__main__":
    sys.exit(main())
