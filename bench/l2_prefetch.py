"""What the L2 prefetch chain (engine/cuda/prefetch.py) buys a decode step, A/B in one run.

    python3 bench/l2_prefetch.py                                   # both shapes, 16-bit and INT4
    python3 bench/l2_prefetch.py --shapes qwen2.5-coder-1.5b --variants 0:0,16:1

For each shape and weight format, one model (bench/decode.py's: random init, tuned
kernels) is captured again under each variant `MB:E` (prefetch MB ahead, E = 1 marks
each kernel's own weight stream evict-first in L2) and measured the same way: the
median ms/token of 128 greedy tokens after a 512-token prompt (host-observed), and
the decode graph's replay time at a fixed position (device-side, 50 replays). The
variants run in turn, twice round, so drift shows up as a spread rather than as a
difference between variants.

Writes bench/results/<date>-l2-prefetch.json (date, device, torch, command,
copy_bandwidth_gbps, rows: shape, format, prefetch_mb, evict_first, round,
ms_per_token_median, graph_replay_us, floor_ms).
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from common import copy_bandwidth_gbps, device_name  # noqa: E402
from decode import SHAPES, build_hf, bytes_per_token, prepare_nib, summarise  # noqa: E402

from nib.engine.config import ModelConfig  # noqa: E402


def measure(model: torch.nn.Module, prompt: list[int], new: int) -> dict[str, float]:
    import time

    from nib.engine.graphs import GraphRunner

    runner = GraphRunner(model, len(prompt) + new + 16, use_graphs=True)
    runner.capture()
    results = []
    for _ in range(2):
        torch.cuda.synchronize()
        stamps: list[float] = []
        start = time.perf_counter()
        for _token in runner.generate(prompt, True, new):
            stamps.append(time.perf_counter())
        results.append(summarise(stamps, start)[0])  # this run's median
    name = runner._decode_name(0, True)
    graph = runner.graphs[name]
    with torch.cuda.stream(runner.stream):
        runner.pos.fill_(len(prompt) + new // 2)
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        graph.replay()
        begin.record()
        for _ in range(50):
            graph.replay()
        end.record()
    end.synchronize()
    replay_us = begin.elapsed_time(end) * 1e3 / 50
    del runner
    return {"ms_per_token_median": statistics.median(results), "graph_replay_us": replay_us}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--formats", default="bf16,int4")
    parser.add_argument("--variants", default="0:0,8:1,16:1,32:1,16:0")
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    from nib.engine.cuda.prefetch import chain_prefetch

    variants = [(float(v.split(":")[0]), v.split(":")[1] == "1") for v in args.variants.split(",")]
    bandwidth = copy_bandwidth_gbps()
    print(f"device-to-device copy bandwidth: {bandwidth:.0f} GB/s", flush=True)
    prompt = torch.randint(0, 256, (args.prompt,), generator=torch.Generator().manual_seed(0))
    rows: list[dict[str, object]] = []
    for shape in args.shapes.split(","):
        hf = build_hf(shape)
        cfg = ModelConfig.from_hf(hf.config.to_dict())
        for fmt in args.formats.split(","):
            int4 = fmt == "int4"
            model = prepare_nib(hf, int4, args.prompt + args.new + 16)
            nbytes = bytes_per_token(
                cfg, args.prompt + args.new // 2, 0.5 + 2 / 128 if int4 else 2.0
            )
            for rnd in range(2):
                for mb, evict_first in variants:
                    chain_prefetch(model, int(mb * 2**20), evict_first)
                    row = {
                        "shape": shape, "format": fmt, "prefetch_mb": mb,
                        "evict_first": evict_first, "round": rnd,
                        **measure(model, prompt.tolist(), args.new),
                        "floor_ms": nbytes / (bandwidth * 1e9) * 1e3,
                    }  # fmt: skip
                    rows.append(row)
                    print(json.dumps(row), flush=True)
            del model
            gc.collect()
            torch.cuda.empty_cache()
        del hf
        gc.collect()
        torch.cuda.empty_cache()
    today = dt.date.today().isoformat()
    command = "python3 bench/l2_prefetch.py " + " ".join(argv if argv is not None else sys.argv[1:])
    result = {
        "date": today, "device": device_name(), "torch": torch.__version__,
        "command": command.strip(), "copy_bandwidth_gbps": bandwidth, "rows": rows,
    }  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{today}-l2-prefetch.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")
    print("| shape | format | prefetch MB | evict-first | ms/token | replay us |")
    for r in rows:
        print(
            f"| {r['shape']} | {r['format']} | {r['prefetch_mb']:g} | {r['evict_first']} | "
            f"{r['ms_per_token_median']:.3f} | {r['graph_replay_us']:.0f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
