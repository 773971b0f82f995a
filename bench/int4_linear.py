"""INT4 linear layers on the GPU: cuBLAS fp16 vs PyTorch's INT4 (tinygemm) vs nib, in one run.

    python bench/int4_linear.py [--out bench/results] [--triton [--write-tuned]]

Shapes: the linears of Llama-2-7B and Qwen2.5-Coder-1.5B at M = 1, 4, 16.
Weights are rotated through enough copies that none sits in the 60 MiB L2, and
every timing is of calls back to back inside one CUDA graph. `nib-int4` is
the kernel the engine runs on a GPU where nvcc is available: the CUDA
tensor-core kernel (engine/cuda/w4a16.cu), every tile config tried per shape
and the best kept. With --triton the Triton kernels (kernels.candidates and
the batch-1 GEMV's tiles, fused_gemv.SWEEP; each compiles) are swept too, as
`nib-int4-triton`, and --write-tuned records their winners in
engine/quant/tuned.json. Napkin math: bytes = weight + scales; floor = bytes /
the device-to-device copy bandwidth measured at the start of the same run.
Writes bench/results/<date>-int4-linear.json and a table in bench/README.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import copy_bandwidth_gbps, write_readme_table

from nib.engine.cuda.timing import graph_us
from nib.engine.quant import fused_gemv as fg
from nib.engine.quant import kernels
from nib.engine.quant.layout import pack

if TYPE_CHECKING:
    from nib.engine.cuda.w4a16 import CudaInt4, W4Config

LAYERS = {
    "llama-2-7b": {"qkv": (4096, 12288), "o_proj": (4096, 4096), "gate_up": (4096, 22016),
                   "down": (11008, 4096), "lm_head": (4096, 32000)},
    "qwen2.5-coder-1.5b": {"qkv": (1536, 2048), "o_proj": (1536, 1536), "gate_up": (1536, 17920),
                           "down": (8960, 1536), "lm_head": (1536, 151936)},
}  # fmt: skip
MS = (1, 4, 16)
ROTATE_BYTES = 512 << 20  # >> 60 MiB of L2
CALLS = 40  # per graph
BUDGET_S = 200.0  # stop trying extra nib configurations past this


def copies(nbytes: int) -> int:
    return max(2, math.ceil(ROTATE_BYTES / max(nbytes, 1)))


def random_int4(n: int, k: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random 4-bit codes uint8 [N, K] and fp16 group scales [K/128, N] on the GPU."""
    codes = torch.randint(0, 16, (n, k), device="cuda", dtype=torch.uint8, generator=g)
    scales = (torch.rand(k // 128, n, device="cuda", generator=g) * 0.02 + 1e-3).half()
    return codes, scales


def cuda_configs(base: CudaInt4, candidates: Iterable[W4Config], m: int) -> Iterator[W4Config]:
    """The distinct launch shapes `candidates` come to on `base` for m rows (r and the
    splits fitted to the layer by CudaInt4.effective) that this GPU runs, in order."""
    from nib.engine.cuda.w4a16 import runs_on

    seen: set[W4Config] = set()
    for cfg in candidates:
        eff = base.effective(cfg, m)
        if eff not in seen and runs_on(eff, base.capability):
            seen.add(eff)
            yield eff


def check_and_time(
    base: CudaInt4,
    layers: list[CudaInt4],
    x: torch.Tensor,
    out: torch.Tensor,
    m: int,
    cfg: W4Config,
    ref: torch.Tensor,
) -> tuple[float, float | None]:
    """Run cfg once on x into `out` poisoned with NaN and compare with `ref` (fp32); if the
    relative error is at most 1e-3 (NaN, an element not written, fails), time it on
    `layers` (copies of base, back to back in a CUDA graph). Returns (error, µs or None)."""
    out.fill_(float("nan"))
    base.run(x, out, m, cfg, 0)
    torch.cuda.synchronize()
    err = float((out.float() - ref).norm() / ref.norm())
    if not err <= 1e-3:
        return err, None
    for layer in layers:
        layer.prepare(cfg, m)
    return err, graph_us([lambda p=p: p.run(x, out, m, cfg, 0) for p in layers], calls=CALLS)


def bench_layer(k: int, n: int, m: int, deadline: float, triton: bool) -> list[dict]:
    rows = []
    g = torch.Generator(device="cuda").manual_seed(0)
    x16 = torch.randn(m, k, device="cuda", generator=g).half()
    # cuBLAS fp16
    w_bytes = n * k * 2
    ws = [torch.randn(n, k, device="cuda", generator=g).half() for _ in range(copies(w_bytes))]
    outs = torch.empty(m, n, device="cuda", dtype=torch.float16)
    us = graph_us([lambda w=w: torch.matmul(x16, w.t(), out=outs) for w in ws], calls=CALLS)
    rows.append({"impl": "cublas-fp16", "us_median": us, "weight_bytes": w_bytes})
    del ws
    codes, scales = random_int4(n, k, g)  # shared by the INT4 rows
    q_bytes = n * k // 2 + scales.numel() * 2
    # PyTorch INT4 (tinygemm): uint8 [N, K/2] with even k in the high nibble, bf16 activations,
    # scales_and_zeros [K/128, N, 2] with w = (q - 8) * scale + zero, zero = 0 here.
    tiny_bytes = n * k // 2 + scales.numel() * 4
    u8 = (codes[:, 0::2] << 4 | codes[:, 1::2]).contiguous()
    sz = torch.stack([scales.bfloat16(), torch.zeros_like(scales, dtype=torch.bfloat16)], dim=2)
    packed = torch.ops.aten._convert_weight_to_int4pack(u8, 8)
    x_bf = x16.bfloat16()
    ref = (
        x16.float()
        @ ((codes.float() - 8).view(n, k // 128, 128) * scales.t().float()[:, :, None])
        .view(n, k)
        .t()
    )
    tiny_out = torch.ops.aten._weight_int4pack_mm(x_bf, packed, 128, sz)
    tiny_err = float((tiny_out.float() - ref).norm() / ref.norm())
    tiny = [packed] + [packed.clone() for _ in range(copies(tiny_bytes) - 1)]
    us = graph_us(
        [lambda p=p: torch.ops.aten._weight_int4pack_mm(x_bf, p, 128, sz) for p in tiny],
        calls=CALLS,
    )
    rows.append(
        {"impl": "torch-int4", "us_median": us, "weight_bytes": tiny_bytes, "rel_err": tiny_err}
    )
    del tiny, packed
    cuda_row = bench_cuda(codes, scales, x16, ref, m, deadline)
    if cuda_row is not None:
        rows.append(cuda_row)
    if not triton:
        return rows
    # nib's Triton kernels: try the candidates, keep the best
    qw = pack(codes)
    nib = [(qw, scales)] + [(qw.clone(), scales.clone()) for _ in range(copies(q_bytes) - 1)]
    out = torch.empty(m, n, device="cuda", dtype=torch.float16)
    best: tuple[float, kernels.KernelConfig, float] | None = None
    tried = []
    configs = [kernels.choose(m, n, k), *kernels.candidates(m)]
    for cfg in dict.fromkeys(configs):
        if cfg.path == "gemv" and m > cfg.block_m:
            continue
        if best is not None and time.monotonic() > deadline:
            break
        try:
            kernels.run(x16, qw, scales, None, cfg, out=out)
            err = float((out.float() - ref).norm() / ref.norm())
            if not err <= 1e-3:
                tried.append(f"{cfg.label()}: WRONG (rel err {err:.1e})")
                continue
            us = graph_us(
                [lambda w=w, s=s, c=cfg: kernels.run(x16, w, s, None, c, out=out) for w, s in nib],
                calls=CALLS,
            )
        except Exception as exc:  # a configuration that does not compile or launch here
            tried.append(
                f"{cfg.label()}: {type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}"
            )
            continue
        tried.append(f"{cfg.label()}: {us:.2f} us")
        if best is None or us < best[0]:
            best = (us, cfg, err)
    general = best  # the best of kernels.py's paths: what tuned.json records for this M
    if m == 1:  # the batch-1 GEMV (quant/fused_gemv.py), which the engine runs at one row
        out1 = out.view(n)
        # The tiles start-up chooses from are always tried (the first shape's budget also
        # pays for compiling the general kernels); the rest of the sweep while time lasts.
        for i, cfg in enumerate(fg.SWEEP):
            if i >= len(fg.CANDIDATES) and time.monotonic() > deadline:
                break
            try:
                bufs = [fg.split_buffers(n, cfg, x16.device) for _ in nib]
                fg.launch(x16, qw, scales, None, out1, n, cfg, buffers=bufs[0])
                err = float((out.float() - ref).norm() / ref.norm())
                if not err <= 1e-3:
                    tried.append(f"{cfg.label()}: WRONG (rel err {err:.1e})")
                    continue
                us = graph_us(
                    [
                        lambda w=w, s=s, c=cfg, b=b: fg.launch(
                            x16, w, s, None, out1, n, c, buffers=b
                        )
                        for (w, s), b in zip(nib, bufs, strict=True)
                    ],
                    calls=CALLS,
                )
            except Exception as exc:  # a configuration that does not compile or launch here
                tried.append(f"{cfg.label()}: {type(exc).__name__}: {str(exc)[:120]}")
                continue
            tried.append(f"{cfg.label()}: {us:.2f} us")
            if best is None or us < best[0]:
                best = (us, cfg, err)
    if best is not None:
        rows.append({"impl": "nib-int4-triton", "us_median": best[0], "weight_bytes": q_bytes,
                     "config": best[1].label(), "config_fields": best[1].__dict__, "rel_err": best[2],
                     "tried": tried,
                     "general_config_fields": general[1].__dict__ if general else None})  # fmt: skip
    else:
        print(f"  nib: no configuration ran: {tried}", file=sys.stderr)
    return rows


def bench_cuda(
    codes: torch.Tensor,
    scales: torch.Tensor,
    x16: torch.Tensor,
    ref: torch.Tensor,
    m: int,
    deadline: float,
) -> dict | None:
    """nib's CUDA tensor-core kernel (engine/cuda/w4a16.cu), every tile config for this M."""
    from nib.engine.cuda import loader
    from nib.engine.cuda.w4a16 import MULTI_ROW, ONE_ROW, CudaInt4

    why = loader.unavailable_reason(x16.device)
    if why:
        print(f"  nib CUDA kernels unavailable: {why}", file=sys.stderr)
        return None
    n = codes.shape[0]
    base = CudaInt4(codes, scales, None, "", "bench", torch.float16)
    layers = [base] + [base.clone() for _ in range(copies(base.weight_bytes) - 1)]
    out = torch.empty(m, n, device="cuda", dtype=torch.float16)
    best: tuple[float, str, dict, float] | None = None
    tried = []
    for eff in cuda_configs(base, ONE_ROW if m == 1 else MULTI_ROW, m):
        try:
            err, us = check_and_time(base, layers, x16, out, m, eff, ref)
            if us is None:
                tried.append(f"{eff.label()}: WRONG (rel err {err:.1e})")
                continue
        except Exception as exc:  # a configuration that fails here is reported, not fatal
            tried.append(f"{eff.label()}: {type(exc).__name__}: {str(exc)[:160]}")
            continue
        tried.append(f"{eff.label()}: {us:.2f} us")
        if best is None or us < best[0]:
            best = (us, eff.label(), eff.__dict__, err)
    if best is None:
        print(f"  nib cuda: no configuration ran: {tried}", file=sys.stderr)
        return None
    return {"impl": "nib-int4", "us_median": best[0], "weight_bytes": base.weight_bytes,
            "config": best[1], "config_fields": best[2], "rel_err": best[3], "tried": tried,
            "general_config_fields": None, "kernel": "cuda"}  # fmt: skip


def markdown(result: dict) -> str:
    lines = [
        f"### INT4 linear layers ({result['date']}, {result['device']}, torch {result['torch']})",
        "",
        f"`{result['command']}`; copy bandwidth measured in the same run: "
        f"{result['copy_bandwidth_gbps']:.0f} GB/s. us per call inside a CUDA graph, weights "
        "rotated out of L2; GB/s = weight + scale bytes / time.",
        "",
        "| layer | M | cuBLAS fp16 us | torch INT4 us | nib INT4 us | nib GB/s | nib / copy BW | nib config |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    by = {}
    for r in result["rows"]:
        by.setdefault((r["layer"], r["m"]), {})[r["impl"]] = r
    for (layer, m), d in by.items():
        nib = d.get("nib-int4")
        cells = [
            f"{d[i]['us_median']:.1f}" if i in d else "-"
            for i in ("cublas-fp16", "torch-int4", "nib-int4")
        ]
        lines.append(
            f"| {layer} | {m} | {' | '.join(cells)} | "
            + (
                f"{nib['gbps']:.0f} | {nib['fraction_of_copy_bw']:.2f} | {nib['config']} |"
                if nib
                else "- | - | - |"
            )
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    p.add_argument("--write-tuned", action="store_true", help="write engine/quant/tuned.json")
    p.add_argument("--no-readme", action="store_true", help="leave bench/README.md alone")
    p.add_argument("--budget-s", type=float, default=BUDGET_S, help="time for trying configs")
    p.add_argument(
        "--triton", action="store_true", help="also sweep the Triton kernels (nib-int4-triton)"
    )
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("bench/int4_linear.py needs a CUDA GPU", file=sys.stderr)
        return 2
    started = time.monotonic()
    bw = copy_bandwidth_gbps()
    print(f"copy bandwidth {bw:.0f} GB/s", flush=True)
    rows, tuned = [], []
    gemv1: dict[tuple[int, int], dict] = {}
    shapes = [
        (model, name, k, n) for model, layers in LAYERS.items() for name, (k, n) in layers.items()
    ]
    total = len(shapes) * len(MS)
    done = 0
    for model, name, k, n in shapes:
        for m in MS:
            done += 1
            deadline = started + args.budget_s * done / total  # spread the tuning budget evenly
            for r in bench_layer(k, n, m, deadline, args.triton):
                r.update(
                    layer=f"{model}.{name}", m=m, gbps=r["weight_bytes"] / r["us_median"] / 1e3
                )
                r["fraction_of_copy_bw"] = r["gbps"] / bw
                rows.append(r)
                triton_row = r["impl"] == "nib-int4-triton"
                if triton_row and m == 1 and "path" not in r["config_fields"]:
                    gemv1[(n, k)] = r["config_fields"]  # the batch-1 GEMV won
                if triton_row and r["general_config_fields"]:
                    fields = r["general_config_fields"]
                    tuned.append(kernels.TunedEntry(n, k, m, kernels.KernelConfig(**fields)))
                print(f"  {r['layer']:<32} m={m:<3} {r['impl']:<12} {r['us_median']:8.2f} us "
                      f"{r['gbps']:7.0f} GB/s {r.get('config', '')}", flush=True)  # fmt: skip
    date = datetime.date.today().isoformat()
    result = {
        "date": date,
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "command": "python " + " ".join(["bench/int4_linear.py", *sys.argv[1:]]),
        "copy_bandwidth_gbps": bw,
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{date}-int4-linear.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    table = markdown(result)
    if not args.no_readme:
        caption = (
            f"{result['device']}, torch {result['torch']}, {date}, copy bandwidth {bw:.0f} GB/s, "
            f"`{result['command']}`"
        )
        write_readme_table("int4-linear", caption, table.rstrip("\n").split("\n"))
    if args.write_tuned and args.triton:
        text = json.loads(kernels.tuned_entries_json(tuned))
        text["gemv1"] = [
            {"n": n, "k": k, "config": fields} for (n, k), fields in sorted(gemv1.items())
        ]
        kernels.TUNED_FILE.write_text(json.dumps(text, indent=1) + "\n")
    summary(result, path, time.monotonic() - started)
    return 0


def summary(result: dict, path: Path, elapsed: float) -> None:
    from targets import ISSUE_5, linear_us

    print(f"\nwrote {path} ({elapsed:.0f} s)\n")
    print(f"{'target':<50} {'cublas-fp16':>12} {'torch-int4':>11} {'nib-int4':>9} {'bound':>6}")
    for what, layers, m, bound in ISSUE_5:
        us = {i: linear_us(result, layers, m, i) for i in ("cublas-fp16", "torch-int4", "nib-int4")}
        nib = us["nib-int4"]
        verdict = "ok" if nib is not None and nib <= bound else "MISS"
        cells = " ".join(
            f"{'-' if x is None else f'{x:.1f}':>{w}}"
            for x, w in zip(us.values(), (12, 11, 9), strict=True)
        )
        print(f"{what:<50} {cells} {bound:6.0f} {verdict}")


if __name__ == "__main__":
    sys.exit(main())
