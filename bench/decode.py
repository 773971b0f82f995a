"""Batch-1 decode latency: nib against transformers, in one process, one run.

    python3 bench/decode.py                      # both shapes, prompt 512, 128 new tokens
    python3 bench/decode.py --shapes qwen2.5-coder-1.5b --impls nib-graphs

Randomly initialised models of real shapes (weights cannot be downloaded
here), bf16, greedy. For every row: median and p90 ms per decoded token
(host-observed: time between consecutive tokens reaching the host), time to
first token, the bytes a decode step must read (weights + the KV cache at the
mean context), the floor those bytes imply at the device-to-device copy
bandwidth measured in the same run, and the fraction of that floor achieved.
For nib's graph path it also profiles one decode step: kernels per step, the
sum of kernel times, and the graph replay time (the difference is the gaps).

Writes bench/results/<date>-decode.json and the table in bench/README.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import itertools
import json
import os
import statistics
import sys
import time
from pathlib import Path

# Kineto leaves CUPTI attached when a profile ends unless TEARDOWN_CUPTI=1 (pytorch/
# pytorch#144455); every row is timed after the previous row's profile (profile_decode_step).
# bench/profiler_residue.py found no residue with torch 2.11 on the H200 (2026-12-03); the
# teardown keeps the rows independent of their order on a torch where there is one.
os.environ.setdefault("TEARDOWN_CUPTI", "1")

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from common import copy_bandwidth_gbps, device_name, write_readme_table  # noqa: E402

from nib.engine.config import ModelConfig  # noqa: E402

SHAPES: dict[str, dict[str, object]] = {
    "llama-2-7b": dict(
        model_type="llama",
        vocab_size=32000,
        hidden_size=4096,
        intermediate_size=11008,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=32,
        max_position_embeddings=4096,
        rope_theta=10000.0,
        tie_word_embeddings=False,
    ),
    "qwen2.5-coder-1.5b": dict(
        model_type="qwen2",
        vocab_size=151936,
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        rope_theta=1000000.0,
        tie_word_embeddings=True,
    ),
}
IMPLS = (
    "nib-eager",
    "nib-graphs",
    "nib-int4-graphs",
    "hf-eager",
    "hf-static-compile",
    "torch-int4-compile",
)
LONG_IMPLS = ("nib-graphs", "nib-int4-graphs")  # also measured at --long-prompt


def build_hf(shape: str) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    spec = dict(SHAPES[shape])
    config = AutoConfig.for_model(str(spec.pop("model_type")), **spec)
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda"):
            model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    finally:
        torch.set_default_dtype(previous)
    return model.eval()


def build_nib(hf: torch.nn.Module, dtype: torch.dtype = torch.bfloat16) -> torch.nn.Module:
    from nib.engine.loader import build_model

    cfg = ModelConfig.from_hf(hf.config.to_dict())
    state = hf.state_dict()
    return build_model(cfg, {n: (lambda t=t: t) for n, t in state.items()}, dtype, "cuda")


def prepare_nib(hf: torch.nn.Module, int4: bool, max_context: int) -> torch.nn.Module:
    """nib's GPU model: fused glue ops, tuned GEMV (16-bit) or RTN INT4 linears (fp16)."""
    from nib.engine.ops import TritonOps
    from nib.engine.startup import swap_in_linear_kernels

    model = build_nib(hf, torch.float16 if int4 else torch.bfloat16)
    model.setup_cache(max_context)
    model.ops = TritonOps()
    if int4:
        from nib.engine.quant.swap import quantize_model

        quantize_model(model)
    choices = swap_in_linear_kernels(model, torch.device("cuda"))
    print(f"linear kernels {choices}", flush=True)
    return model


def graph_runner(shape: str, int4: bool, max_context: int) -> object:
    """`shape`'s model (random weights, prepare_nib) in a GraphRunner with graphs on, each
    layer shape at its per-shape config pick: no step tuning yet, nothing captured."""
    from nib.engine.graphs import GraphRunner

    hf = build_hf(shape)
    model = prepare_nib(hf, int4, max_context)
    del hf
    gc.collect()
    return GraphRunner(model, max_context, use_graphs=True)


def tuned_runner(shape: str, int4: bool, max_context: int) -> tuple[object, dict[str, str]]:
    """graph_runner() with its decode step tuned as start-up tunes it, nothing captured
    yet; and the choices. What bench/step_ends.py, step_timeline.py and cuda_variants.py
    time."""
    from nib.engine.step_tuning import tune_step

    runner = graph_runner(shape, int4, max_context)
    return runner, tune_step(runner)


def replay_graph_us(runner, graph, replays: int = 50) -> float:  # type: ignore[no-untyped-def]
    """µs per replay of a captured graph on the runner's stream: one untimed replay, then
    `replays` back to back between two events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(runner.stream):
        graph.replay()
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
    end.synchronize()
    return float(start.elapsed_time(end) * 1e3 / replays)


def force_configs(model: torch.nn.Module, forced: list[str]) -> dict[str, str]:
    """Apply `KNOB=LABEL` choices after the step tuning (engine/step_tuning.py's knob
    names, e.g. "int4 4096x4096 +residual=int4 mma16 r1w8p2"): what a kernel's launch
    shape does to its neighbours in the step, measured rather than guessed."""
    from nib.engine.cuda.w4a16 import ONE_ROW
    from nib.engine.step_tuning import _config_knobs

    knobs = {k.name: k for k in _config_knobs(model)}
    applied = {}
    for item in forced:
        name, _, label = item.partition("=")
        knob = knobs.get(name)
        if knob is None:
            raise SystemExit(f"--force {item!r}: no knob {name!r}; knobs: {sorted(knobs)}")
        pool = [*knob.options, *(ONE_ROW if name.startswith("int4") else ())]
        match = [o for o in pool if knob.label(o) == label]
        if not match:
            labels = sorted({knob.label(o) for o in pool})
            raise SystemExit(f"--force {item!r}: no config {label!r}; configs: {labels}")
        knob.apply(match[0])
        applied[name] = label
    return applied


def run_torch_int4(hf: torch.nn.Module, prompt: list[int], new: int, reps: int) -> dict[str, float]:
    from torch_int4 import compiled_decode_step, prefill, swap_torch_int4

    model = build_nib(hf, torch.bfloat16)
    model.setup_cache(len(prompt) + new + 16)
    swap_torch_int4(model)
    step = compiled_decode_step(model)
    ids = torch.tensor([prompt], device="cuda")
    started = time.perf_counter()
    results = []
    for rep in range(reps + 2):  # two warm-up runs compile and capture
        torch.cuda.synchronize()
        stamps: list[float] = []
        start = time.perf_counter()
        with torch.inference_mode():
            token = prefill(model, ids)
            stamps.append(time.perf_counter() if int(token) >= 0 else 0.0)
            for i in range(new - 1):
                # The compiled step's output lives in its CUDA graph's memory: copy it
                # out before the next replay overwrites it.
                torch.compiler.cudagraph_mark_step_begin()
                position = torch.tensor([len(prompt) + i], device="cuda")
                token = step(token.view(1, 1), position).clone()
                stamps.append(time.perf_counter() if int(token) >= 0 else 0.0)
        if rep >= 2:
            results.append(summarise(stamps, start))
        elif rep == 1:
            warm_s = time.perf_counter() - started
    row = _median_row(results)
    row["warmup_s"] = warm_s
    del model, step
    return row


def bytes_per_token(cfg, context: int, weight_bytes: float = 2.0) -> int:  # type: ignore[no-untyped-def]
    """What one decode step must read: every linear (incl. the lm_head), the norms, one
    embedding row, and the KV cache (16-bit) at `context` positions."""
    per_layer = cfg.hidden_size * (cfg.q_size + 2 * cfg.kv_size) + cfg.q_size * cfg.hidden_size
    per_layer += 3 * cfg.hidden_size * cfg.intermediate_size
    linear = (cfg.num_layers * per_layer + cfg.vocab_size * cfg.hidden_size) * weight_bytes
    norms = (2 * cfg.num_layers + 1) * cfg.hidden_size * 2
    kv = 2 * cfg.num_layers * context * cfg.kv_size * 2
    return int(linear + norms + cfg.hidden_size * 2 + kv)


def summarise(stamps: list[float], start: float) -> tuple[float, float, float]:
    gaps = sorted((b - a) * 1e3 for a, b in itertools.pairwise(stamps))
    median = statistics.median(gaps)
    p90 = gaps[min(len(gaps) - 1, int(0.9 * len(gaps)))]
    return median, p90, (stamps[0] - start) * 1e3


def run_nib(
    model: torch.nn.Module, use_graphs: bool, prompt: list[int], new: int, reps: int
) -> dict[str, float]:
    from nib.engine.graphs import GraphRunner

    runner = GraphRunner(model, len(prompt) + new + 16, use_graphs=use_graphs)
    started = time.perf_counter()
    if use_graphs:  # as the engine's start-up does (engine/step_tuning.py)
        from nib.engine.step_tuning import tune_step

        tuned = tune_step(runner)
        print(f"step tuning {tuned}", flush=True)
    runner.capture()
    capture_s = time.perf_counter() - started
    results = []
    for _ in range(reps):
        torch.cuda.synchronize()
        stamps: list[float] = []
        start = time.perf_counter()
        for _token in runner.generate(prompt, True, new):
            stamps.append(time.perf_counter())
        assert len(stamps) == new
        results.append(summarise(stamps, start))
    row = _median_row(results)
    row["capture_s"] = capture_s  # incl. the step tuning
    if use_graphs:
        row["step_tuning"] = runner.step_tuning
        row.update(profile_decode_step(runner, position=len(prompt) + new // 2))
    del runner
    return row


def profile_decode_step(runner, position: int) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """Kernels per decode step and their summed time (eager run of the step body under the
    profiler) against the graph replay time of the same step, at `position` (the run's
    mid-decode position: attention's share grows with it): the difference is the gaps."""
    from torch.profiler import ProfilerActivity, profile

    steps = 5
    name = runner._decode_name(0, True)
    body, graph = runner.bodies[name], runner.graphs.get(name)
    with torch.cuda.stream(runner.stream), torch.inference_mode():
        runner.pos.fill_(position)
        body()
    runner.stream.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        with torch.cuda.stream(runner.stream), torch.inference_mode():
            for _ in range(steps):
                runner.pos.fill_(position)
                body()
        runner.stream.synchronize()
    kernels = [
        e
        for e in prof.events()
        if e.device_type.name == "CUDA" and "Memcpy" not in e.name and "Memset" not in e.name
    ]
    kernel_us = sum(e.device_time_total for e in kernels) / steps
    by_name: dict[str, list[float]] = {}
    for e in kernels:
        by_name.setdefault(e.name[:90], []).append(e.device_time_total)
    top = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:15]
    breakdown = [
        {"kernel": k, "per_step": len(v) / steps, "us_per_step": sum(v) / steps} for k, v in top
    ]
    for b in breakdown:
        print(f"  {b['us_per_step']:9.1f} us  x{b['per_step']:5.1f}  {b['kernel']}", flush=True)
    fills = sum(1 for e in kernels if "fill" in e.name.lower()) / steps  # pos.fill_ of this harness
    replay_us = float("nan") if graph is None else replay_graph_us(runner, graph)
    return {
        "profile_position": position,
        "kernels_top": breakdown,
        "kernels_per_step": len(kernels) / steps - fills,
        "kernel_sum_us": kernel_us,
        "graph_replay_us": replay_us,
    }


class _TimingStreamer:
    """transformers streamer protocol: put() per step (the prompt first), end() at the end."""

    def __init__(self) -> None:
        self.stamps: list[float] = []

    def put(self, value: torch.Tensor) -> None:
        self.stamps.append(time.perf_counter())

    def end(self) -> None:
        pass


def run_hf(
    hf: torch.nn.Module, static: bool, prompt: list[int], new: int, reps: int
) -> dict[str, float]:
    ids = torch.tensor([prompt], device="cuda")
    kwargs: dict[str, object] = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False)
    if static:
        kwargs["cache_implementation"] = "static"
    started = time.perf_counter()
    warmups = 2 if static else 1  # the static cache compiles on its first calls
    for _ in range(warmups):
        hf.generate(ids, **kwargs)
    warm_s = time.perf_counter() - started
    results = []
    for _ in range(reps):
        streamer = _TimingStreamer()
        torch.cuda.synchronize()
        start = time.perf_counter()
        hf.generate(ids, streamer=streamer, **kwargs)
        results.append(summarise(streamer.stamps[1:], start))
    row = _median_row(results)
    row["warmup_s"] = warm_s
    return row


def _median_row(results: list[tuple[float, float, float]]) -> dict[str, float]:
    return {
        "ms_per_token_median": statistics.median(r[0] for r in results),
        "ms_per_token_p90": statistics.median(r[1] for r in results),
        "ttft_ms": statistics.median(r[2] for r in results),
    }


def bench_shape(
    shape: str, impls: list[str], prompt: list[int], new: int, reps: int, bandwidth: float,
    long_prompt: list[int],
) -> list[dict[str, object]]:  # fmt: skip
    hf = build_hf(shape)
    cfg = ModelConfig.from_hf(hf.config.to_dict())
    rows: list[dict[str, object]] = []
    for impl in impls:
        int4 = "int4" in impl
        runs = [prompt] + ([long_prompt] if impl in LONG_IMPLS and long_prompt else [])
        if impl.startswith("nib"):
            model = prepare_nib(hf, int4, max(len(p) for p in runs) + new + 16)
        for p in runs:
            if impl.startswith("nib"):
                row = run_nib(model, impl != "nib-eager", p, new, reps)
            elif impl == "torch-int4-compile":
                row = run_torch_int4(hf, p, new, reps)
            else:
                row = run_hf(hf, impl == "hf-static-compile", p, new, reps)
            nbytes = bytes_per_token(cfg, len(p) + new // 2, 0.5 + 2 / 128 if int4 else 2.0)
            floor = nbytes / (bandwidth * 1e9) * 1e3
            full = {
                "shape": shape,
                "impl": impl,
                "context": len(p) + new,
                **row,
                "bytes_per_token": nbytes,
                "floor_ms": floor,
                "fraction_of_floor": floor / row["ms_per_token_median"],
            }
            rows.append(full)
            print(json.dumps(full), flush=True)
        if impl.startswith("nib"):
            del model
        gc.collect()
        torch.cuda.empty_cache()
    return rows


def readme_table(result: dict) -> list[str]:  # type: ignore[type-arg]
    table = [
        "| shape | impl | context | ms/token (median) | p90 | TTFT ms | MB/token | floor ms | % of floor |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    order = {shape: i for i, shape in enumerate(SHAPES)}  # rows of later runs join their shape
    for r in sorted(result["rows"], key=lambda r: order.get(r["shape"], len(order))):
        table.append(
            f"| {r['shape']} | {r['impl']} | {r['context']} | {r['ms_per_token_median']:.3f} | "
            f"{r['ms_per_token_p90']:.3f} | {r['ttft_ms']:.1f} | {r['bytes_per_token'] / 1e6:.0f} | "
            f"{r['floor_ms']:.3f} | {100 * r['fraction_of_floor']:.0f}% |"
        )
    return table


BEFORE = ROOT / "bench" / "results" / "2026-11-29-decode.json"  # the Triton-only engine
PROFILE_POSITION_BEFORE = 300  # where profile_decode_step profiled every row until 2026-12-01


def profile_table(result: dict, before: dict | None = None) -> list[str]:  # type: ignore[type-arg]
    """Kernels per decode step and the graph replay against the sum of its kernels' times
    (profile_decode_step), for nib's graph rows at the position each was profiled at
    (rows without one were profiled at PROFILE_POSITION_BEFORE); `before`: the same
    columns from an earlier result where it has the row. Sum above replay means kernels
    overlap (programmatic dependent launch); below it, the difference is gaps between
    kernels."""
    old = {(r["shape"], r["impl"], r["context"]): r for r in (before or {}).get("rows", [])}
    table = [
        "| shape | impl | context | at position | kernels / step | kernel sum µs | replay µs "
        "| replay - sum µs | before: kernels | sum µs | replay µs |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    order = {shape: i for i, shape in enumerate(SHAPES)}
    # Rows profiled before profile_position was recorded were all profiled at one
    # position, whatever their context: of those, one row per shape and impl.
    seen: set[tuple[str, str]] = set()
    rows = []
    for r in sorted(result["rows"], key=lambda r: r["context"]):
        if "graph_replay_us" not in r:
            continue
        if "profile_position" not in r:
            if (r["shape"], r["impl"]) in seen:
                continue
            seen.add((r["shape"], r["impl"]))
        rows.append(r)
    rows.sort(key=lambda r: (order.get(r["shape"], len(order)), r["impl"], r["context"]))
    for r in rows:
        b = old.get((r["shape"], r["impl"], r["context"]))
        then = (
            f"{b['kernels_per_step']:.0f} | {b['kernel_sum_us']:.0f} | {b['graph_replay_us']:.0f}"
            if b and "graph_replay_us" in b
            else "- | - | -"
        )
        at = r.get("profile_position", PROFILE_POSITION_BEFORE)
        table.append(
            f"| {r['shape']} | {r['impl']} | {r['context']} | {at} | {r['kernels_per_step']:.0f} | "
            f"{r['kernel_sum_us']:.0f} | {r['graph_replay_us']:.0f} | "
            f"{r['graph_replay_us'] - r['kernel_sum_us']:+.0f} | {then} |"
        )
    return table


def profile_caption(result: dict, before: dict | None) -> str:  # type: ignore[type-arg]
    since = (
        f"; before: the same rows on {before['date']} (`results/{BEFORE.name}`), profiled at "
        f"position {PROFILE_POSITION_BEFORE}"
        if before
        else ""
    )
    return (
        f"One decode step of each nib graph row at the position given, its body run eagerly under "
        f"the CUDA profiler (kernel count and summed kernel time) and its graph replayed "
        f"({result['date']}, `bench/decode.py`){since}"
    )


def readme_caption(result: dict) -> str:  # type: ignore[type-arg]
    runs = "; ".join(f"`{c}`" for c in result.get("commands", [result["command"]]))
    days = sorted({str(r["run"])[:10] for r in result["rows"] if "run" in r} or {result["date"]})
    return f"{result['device']}, torch {result['torch']}, rows measured {', '.join(days)}; {runs}"


def carried_rows(
    out: Path, today: str, rows: list[dict[str, object]], device: str
) -> list[dict[str, object]]:
    """The rows of the newest result up to today (today's, else the last day's) that this
    run does not measure again: a result file holds the latest row of every shape, impl and
    context, each with the `run` and `command` that measured it (readme_caption names
    their days). None where that result was measured on another device: a file names one."""
    files = sorted(p for p in out.glob("*-decode.json") if p.name[:10] <= today)
    if not files:
        return []
    earlier = json.loads(files[-1].read_text())
    if earlier.get("device") != device:
        return []
    replaced = {(r["shape"], r["impl"], r["context"]) for r in rows}
    return [
        r for r in earlier.get("rows", []) if (r["shape"], r["impl"], r["context"]) not in replaced
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--impls", default=",".join(IMPLS))
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument(
        "--long-prompt", type=int, default=3968, help="nib graph rows also here (0: skip)"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    torch.backends.cuda.matmul.allow_tf32 = True
    bandwidth = copy_bandwidth_gbps()
    print(f"device-to-device copy bandwidth: {bandwidth:.0f} GB/s", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, object]] = []
    gen = torch.Generator().manual_seed(0)
    for shape in args.shapes.split(","):
        prompt = torch.randint(0, 256, (args.prompt,), generator=gen).tolist()
        long_prompt = torch.randint(0, 256, (args.long_prompt,), generator=gen).tolist()
        rows += bench_shape(
            shape, args.impls.split(","), prompt, args.new, args.reps, bandwidth, long_prompt
        )
        (args.out / "partial-decode.json").write_text(json.dumps(rows, indent=2) + "\n")
        gc.collect()
        torch.cuda.empty_cache()
    today = dt.date.today().isoformat()
    command = "python3 bench/decode.py " + " ".join(argv if argv is not None else sys.argv[1:])
    for row in rows:  # a day's file may hold rows of several runs (e.g. --impls)
        row.update(
            command=command, copy_bandwidth_gbps=bandwidth, run=dt.datetime.now().isoformat()
        )
    path = args.out / f"{today}-decode.json"
    device = device_name()
    kept = carried_rows(args.out, today, rows, device)
    result = {
        "date": today,
        "device": device,
        "torch": torch.__version__,
        "command": command,
        # The commands behind the rows kept (a row replaced by this run drops its command).
        "commands": list(dict.fromkeys(r.get("command", command) for r in kept + rows)),
        "copy_bandwidth_gbps": bandwidth,
        "prompt_tokens": args.prompt,
        "new_tokens": args.new,
        "rows": kept + rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    (args.out / "partial-decode.json").unlink(missing_ok=True)
    table = readme_table(result)
    write_readme_table("decode", readme_caption(result), table)
    before = json.loads(BEFORE.read_text()) if BEFORE.exists() else None
    write_readme_table(
        "decode-profile", profile_caption(result, before), profile_table(result, before)
    )
    print(f"wrote {path}")
    print("\n".join(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
