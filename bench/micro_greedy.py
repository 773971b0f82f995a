"""The greedy step's end: the CUDA kernel (engine/cuda/greedy.py) vs the PyTorch sequence.

    python3 bench/micro_greedy.py --out bench/results

What graphs.py runs after the lm_head of a greedy step, timed inside a CUDA graph:
- torch: the current sequence (fp32 copy of the row, argmax, gather, logsumexp,
  the token into the device input, two non-blocking copies into pinned slots); for
  8 rows the verify graph's (argmax and logprob per row, two copies);
- cuda: one launch of greedy.cu storing into the same pinned slots (the engine's);
- cuda-nofence: the same without the system-scope fence at the kernel's end;
- cuda-device: the kernel writing device buffers, no fence (the host stores' cost).
Shapes: Llama (vocab 32000) and Qwen2.5 (151936) rows, bf16 and fp16 (fp32 once),
1 row (decode, and prefill with the token-healing bias) and 8 (verify). "warm"
reads one logits buffer, which sits in L2 as the lm_head's fresh output does;
"cold" rotates through copies larger than the 60 MiB L2. Each variant is CALLS
back-to-back calls in one graph, the median of REPLAYS replays, per call.

Napkin math: a row is 64 KB (Llama, 16-bit) to 304 KB (Qwen); from L2 at several
TB/s that is well under a microsecond, so the kernel should be bound by latency:
one launch (~2 us in a graph), one L2 round trip for its loads, the counter's
atomic and the last block's merge (~1 us each) -> ~3-5 us, against ~35-40 us
measured for the torch sequence in the decode graph.
Writes bench/results/<date>-micro-greedy.json (date, device, torch, command, rows).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import device_name

from nib.engine.cuda.greedy import CudaGreedy, blocks_for
from nib.engine.cuda.timing import graph_us

CALLS = 20
REPLAYS = 50
L2_BYTES = 60 << 20
SHAPES = (
    ("llama", 32000, torch.bfloat16, 1, False),
    ("llama", 32000, torch.float16, 1, False),
    ("llama", 32000, torch.bfloat16, 1, True),
    ("llama", 32000, torch.bfloat16, 8, False),
    ("qwen2.5", 151936, torch.bfloat16, 1, False),
    ("qwen2.5", 151936, torch.float16, 1, False),
    ("qwen2.5", 151936, torch.float32, 1, False),
    ("qwen2.5", 151936, torch.bfloat16, 1, True),
    ("qwen2.5", 151936, torch.bfloat16, 8, False),
)


def torch_finish(
    logits: torch.Tensor,
    bias: torch.Tensor | None,
    token: torch.Tensor,
    out_token: torch.Tensor,
    out_logprob: torch.Tensor,
) -> None:
    """graphs.py's _finish (greedy) before the kernel."""
    row = logits[0].float()
    choose = row if bias is None else row + bias
    best = choose.argmax(dim=-1, keepdim=True)
    logprob = row.gather(0, best) - row.logsumexp(dim=0, keepdim=True)
    token.copy_(best.view(1, 1))
    out_token[:1].copy_(best, non_blocking=True)
    out_logprob[:1].copy_(logprob, non_blocking=True)


def torch_verify(logits: torch.Tensor, out_token: torch.Tensor, out_logprob: torch.Tensor) -> None:
    """graphs.py's _verify_body after the model, before the kernel."""
    rows = logits.float()
    best = rows.argmax(dim=-1)
    logprob = rows.gather(1, best[:, None])[:, 0] - rows.logsumexp(dim=-1)
    out_token[: rows.shape[0]].copy_(best, non_blocking=True)
    out_logprob[: rows.shape[0]].copy_(logprob, non_blocking=True)


def bench_shape(
    family: str, vocab: int, dtype: torch.dtype, rows: int, biased: bool
) -> list[dict[str, object]]:
    device = torch.device("cuda")
    row_bytes = rows * vocab * torch.empty((), dtype=dtype).element_size()
    out: list[dict[str, object]] = []
    greedy = CudaGreedy(vocab, 8, device)
    nofence = CudaGreedy(vocab, 8, device, sys_fence=False)
    out_token = torch.zeros(8, dtype=torch.int64).pin_memory()
    out_logprob = torch.zeros(8).pin_memory()
    dev_token = torch.zeros(8, dtype=torch.int64, device=device)
    dev_logprob = torch.zeros(8, device=device)
    token = torch.zeros((1, 1), dtype=torch.int64, device=device)
    bias = torch.randn(vocab, device=device) * 0.1 if biased else None
    for mode in ("warm", "cold"):
        copies = 1 if mode == "warm" else max(2, math.ceil(2 * L2_BYTES / row_bytes))
        bufs = [(torch.randn(rows, vocab, device=device) * 3).to(dtype) for _ in range(copies)]
        picks = [bufs[i % copies] for i in range(CALLS if copies == 1 else copies)]

        def variants(x: torch.Tensor) -> dict[str, Callable[[], None]]:
            single = rows == 1
            return {
                "torch": (
                    (lambda: torch_finish(x, bias, token, out_token, out_logprob))
                    if single
                    else (lambda: torch_verify(x, out_token, out_logprob))
                ),
                "cuda": lambda: greedy.run(
                    x, out_token[:rows], out_logprob[:rows], bias, token.view(1) if single else None
                ),
                "cuda-nofence": lambda: nofence.run(
                    x, out_token[:rows], out_logprob[:rows], bias, token.view(1) if single else None
                ),
                "cuda-device": lambda: nofence.run(
                    x, dev_token[:rows], dev_logprob[:rows], bias, token.view(1) if single else None
                ),
            }

        for name in ("torch", "cuda", "cuda-nofence", "cuda-device"):
            record: dict[str, object] = {
                "shape": family, "vocab": vocab, "dtype": str(dtype).split(".")[-1],
                "rows": rows, "bias": biased, "l2": mode, "variant": name,
                "blocks_per_row": blocks_for(vocab, dtype), "bytes": row_bytes,
            }  # fmt: skip
            try:
                us = graph_us([variants(x)[name] for x in picks], reps=REPLAYS)
                record["us"] = round(us, 2)
                record["gb_per_s"] = round(row_bytes / (us * 1e-6) / 1e9, 1)
            except Exception as exc:  # report and go on with the other variants
                record["error"] = f"{type(exc).__name__}: {exc}"
                traceback.print_exc()
                torch.cuda.synchronize()
            out.append(record)
            print(_line(record), flush=True)
        del bufs, picks
    return out


def _line(r: dict[str, object]) -> str:
    shape = f"{r['shape']} V={r['vocab']} {r['dtype']} rows={r['rows']}"
    shape += " +bias" if r["bias"] else ""
    if "error" in r:
        return f"| {shape} | {r['l2']} | {r['variant']} | failed: {r['error']} | |"
    return f"| {shape} | {r['l2']} | {r['variant']} | {r['us']:.2f} | {r['gb_per_s']} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("needs a CUDA GPU")
    from nib.engine.cuda import loader

    why = loader.unavailable_reason(torch.device("cuda"))
    rows: list[dict[str, object]] = []
    print("| shape | L2 | variant | us per call (median) | GB/s |")
    print("|---|---|---|---:|---:|")
    if why:
        print(f"nib's CUDA kernels are unavailable: {why}")
        rows.append({"error": why})
    else:
        for shape in SHAPES:
            try:
                rows += bench_shape(*shape)
            except Exception as exc:  # one shape's failure must not lose the others
                traceback.print_exc()
                rows.append({"shape": str(shape), "error": f"{type(exc).__name__}: {exc}"})
    date = datetime.date.today().isoformat()
    result = {
        "date": date,
        "device": device_name(),
        "torch": torch.__version__,
        "command": " ".join(["python3", *sys.argv]),
        "calls_per_graph": CALLS,
        "replays": REPLAYS,
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{date}-micro-greedy.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
