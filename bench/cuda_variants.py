"""Kernel experiments against the plain build, in one process, on the same weights.

    python3 bench/cuda_variants.py --out bench/results

An experiment in nib's CUDA sources sits behind `#ifdef NIB_...` and is listed, with
what it changes, in engine/cuda/loader.EXPERIMENTS; the plain build (what `nib serve`
runs) is the code without any of them. For each shape and format the model is built
as bench/decode.py builds it and start-up's step tuning runs once, on the plain build;
then, for every variant (a set of defines, `plain` for none), loader.set_defines
switches every nib kernel to that build and

  - checks its output: from one position and token, four greedy decode steps run
    eagerly, and their logits are compared with the plain build's, element by element
    (`identical_logits`, `max_abs_logit_diff`; an experiment that only moves data or
    changes who does a step of the same arithmetic must be bit-identical, one that
    changes arithmetic says so here);
  - times the greedy decode step with the step tuner's own measure
    (engine/step_tuning.step_us: a graph of 8 decode steps at a mid-context position,
    the median of 15 replays), the variants alternating, --rounds rounds.

Same weights, same configs: the difference is the experiment alone. Writes
bench/results/<date>-cuda-variants[-TAG].json (date, device, torch, command, rows: one
per shape, format and variant with its defines, output check, per-round µs and their
median, and `delta_us` against plain; negative is faster). Exits 1 if a variant's
logits differ where --exact (the default) asks for identical ones.

    --variants plain,NIB_SOME_EXPERIMENT (names from engine/cuda/loader.EXPERIMENTS)
    --force 'int4 1536x8960 +residual=int4 mma16 r1w8p4s2c' (a config for a layer shape,
        applied after the tuning, as in bench/step_timeline.py; rows record it as `forced`)

A variant may instead be a choice of layer configs on the plain build, `cfg:KNOB=LABEL`
(several joined by `;`): those configs run for that variant only, every other variant
keeps the tuned (and --force'd) ones. It times a launch shape inside the step, against
the tuning's pick, in the same process; such a variant changes the order of the sums, so
its logits are compared (`max_abs_logit_diff`) but not required to be identical.

    --variants 'plain,cfg:int4 1536x8960 +residual=int4 mma16 r1w16p4'
"""

from __future__ import annotations

import argparse
import gc
import math
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import write_result

CHECK_STEPS = 4


def default_variants() -> list[str]:
    from nib.engine.cuda import loader

    names = sorted(loader.EXPERIMENTS)
    return ["plain", *names] + (["+".join(names)] if len(names) > 1 else [])


CONFIG_PREFIX = "cfg:"


def config_choices(text: str) -> list[str]:
    """ "cfg:K1=L1;K2=L2" -> ["K1=L1", "K2=L2"]; [] for a define variant."""
    if not text.startswith(CONFIG_PREFIX):
        return []
    items = [t for t in text[len(CONFIG_PREFIX) :].split(";") if t]
    if not items or any("=" not in t for t in items):
        raise ValueError(f"--variants: {text!r} is not cfg:KNOB=LABEL[;KNOB=LABEL...]")
    return items


def parse_variant(text: str) -> tuple[str, ...]:
    """ "plain" -> (); "NIB_A+NIB_B" -> ("NIB_A", "NIB_B"), each a listed experiment;
    a `cfg:` variant (layer configs on the plain build) -> ()."""
    from nib.engine.cuda import loader

    if text == "plain" or config_choices(text):
        return ()
    names = tuple(text.split("+"))
    loader.parse_defines(",".join(names), "--variants")
    unknown = [n for n in names if n.split("=")[0] not in loader.EXPERIMENTS]
    if unknown:
        raise ValueError(
            f"--variants: {', '.join(unknown)} not in engine/cuda/loader.EXPERIMENTS "
            f"({', '.join(sorted(loader.EXPERIMENTS))})"
        )
    return names


def switch(defines: tuple[str, ...], device: torch.device) -> None:
    """Every nib module built (or found) with `defines` before anything is captured."""
    from nib.engine.cuda import loader

    loader.set_defines(defines)
    for source in loader.SOURCES:
        loader.module(source, device)


def current_configs(model: torch.nn.Module) -> dict[str, object]:
    """What each of the step tuner's knobs runs now (its options[0])."""
    from nib.engine.step_tuning import _config_knobs

    return {k.name: k.options[0] for k in _config_knobs(model)}


def restore_configs(model: torch.nn.Module, base: dict[str, object]) -> None:
    from nib.engine.step_tuning import _config_knobs

    for knob in _config_knobs(model):
        if knob.name in base:
            knob.apply(base[knob.name])


def greedy_logits(runner: object, position: int, token: int) -> torch.Tensor:
    """The logits of CHECK_STEPS eager greedy decode steps from (position, token)."""
    body = runner.bodies[runner._decode_name(0, True)]  # type: ignore[attr-defined]
    out = []
    runner.keep_logits = True  # type: ignore[attr-defined]
    with torch.cuda.stream(runner.stream), torch.inference_mode():  # type: ignore[attr-defined]
        runner.pos.fill_(position)  # type: ignore[attr-defined]
        runner.token.fill_(token)  # type: ignore[attr-defined]
        for _ in range(CHECK_STEPS):
            body()
            out.append(runner.last_logits.clone())  # type: ignore[attr-defined]
    runner.stream.synchronize()  # type: ignore[attr-defined]
    runner.keep_logits = False  # type: ignore[attr-defined]
    return torch.stack(out)


def measure(
    shape: str, fmt: str, variants: list[str], rounds: int, forced: list[str] | None = None
) -> list[dict[str, object]]:
    import decode  # bench/decode.py: the same model builder and kernels
    from step_timeline import TEST_SHAPES  # tiny-llama, for tests/gpu

    from nib.engine.cuda import loader
    from nib.engine.step_tuning import step_us

    decode.SHAPES.update(TEST_SHAPES)
    device = torch.device("cuda")
    why = loader.unavailable_reason(device)
    if why:
        raise SystemExit(f"cuda_variants.py needs nib's CUDA kernels: {why}")
    defines = {v: parse_variant(v) for v in variants}
    switch((), device)
    runner, tuned = decode.tuned_runner(shape, fmt == "int4", 1024)
    applied = decode.force_configs(runner.model, forced or [])  # type: ignore[attr-defined]
    model = runner.model  # type: ignore[attr-defined]
    base = current_configs(model)
    choices = {v: config_choices(v) for v in variants}

    def select(v: str, model: torch.nn.Module = model) -> dict[str, str]:
        switch(defines[v], device)
        restore_configs(model, base)
        return decode.force_configs(model, choices[v])  # type: ignore[no-any-return]

    position = max(1, min(512, runner.max_context // 2))
    token = 17
    reference = greedy_logits(runner, position, token)
    checks: dict[str, tuple[bool, float | None]] = {}
    configs: dict[str, dict[str, str]] = {}
    for v in variants:
        configs[v] = select(v)
        got = greedy_logits(runner, position, token)
        same = torch.equal(got.view(torch.int32), reference.view(torch.int32))  # bit for bit
        diff = float((got - reference).abs().max())
        # None: a NaN or infinity on one side only (JSON has no such numbers)
        checks[v] = (same, 0.0 if same else diff if math.isfinite(diff) else None)
    times: dict[str, list[float]] = {v: [] for v in variants}
    for _ in range(rounds):
        for v in variants:
            select(v)
            times[v].append(step_us(runner, steps=8, reps=15))
    switch((), device)
    plain = statistics.median(times["plain"]) if "plain" in times else None
    rows = []
    for v in variants:
        median = statistics.median(times[v])
        rows.append(
            {
                "shape": shape,
                "format": fmt,
                "variant": v,
                "defines": list(defines[v]),
                "identical_logits": checks[v][0],
                "max_abs_logit_diff": checks[v][1],
                "step_us_rounds": times[v],
                "step_us_median": median,
                "delta_us": None if plain is None else median - plain,
                "step_tuning": tuned,
                "forced": applied,
                "configs": configs[v],
            }
        )
    del runner, model
    gc.collect()
    torch.cuda.empty_cache()
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--variants", default=None, help="comma-separated; default: plain, each "
                    "experiment, all of them together")  # fmt: skip
    ap.add_argument("--shapes", default="qwen2.5-coder-1.5b,llama-2-7b")
    ap.add_argument("--formats", default="int4,bf16", help="int4 (fp16 activations) and/or bf16")
    ap.add_argument("--rounds", type=int, default=5, help="alternations of the variants")
    ap.add_argument("--no-exact", dest="exact", action="store_false",
                    help="do not fail when a variant's logits differ from plain's")  # fmt: skip
    ap.add_argument("--force", action="append", default=[], metavar="KNOB=LABEL",
                    help="after the step tuning, run this config for a layer shape "
                    "(repeatable; bench/step_timeline.py's --force): an experiment in a "
                    "config the tuning did not pick")  # fmt: skip
    ap.add_argument("--tag", default="")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    variants = args.variants.split(",") if args.variants else default_variants()
    if "plain" not in variants:
        variants = ["plain", *variants]
    try:
        for v in variants:
            parse_variant(v)
    except ValueError as exc:
        ap.error(str(exc))
    for fmt in args.formats.split(","):
        if fmt not in ("int4", "bf16"):
            ap.error(f"--formats: {fmt!r} is not int4 or bf16")
    if not torch.cuda.is_available():
        print("cuda_variants.py needs a CUDA GPU", file=sys.stderr)
        return 2
    name = "cuda-variants" + (f"-{args.tag}" if args.tag else "")
    rows: list[dict[str, object]] = []
    for shape in args.shapes.split(","):
        for fmt in args.formats.split(","):
            print(f"== {shape} {fmt}", flush=True)
            got = measure(shape, fmt, variants, args.rounds, args.force)
            rows += got
            for r in got:
                delta = r["delta_us"]
                print(
                    f"   {r['variant']:48s} {r['step_us_median']:8.1f} us/step "
                    f"({'' if delta is None else f'{delta:+.1f}'}) identical={r['identical_logits']} "
                    "rounds " + " ".join(f"{t:.1f}" for t in r["step_us_rounds"]),  # type: ignore[attr-defined]
                    flush=True,
                )
            if args.out:  # what has been measured survives a later row's failure
                write_result(args.out, name, "cuda_variants.py", {"rows": rows})
    print("| shape | format | variant | µs/step | vs plain | logits identical |")
    print("|---|---|---|---:|---:|---|")
    for r in rows:
        delta = "" if r["delta_us"] is None else f"{r['delta_us']:+.1f}"
        print(
            f"| {r['shape']} | {r['format']} | {r['variant']} | {r['step_us_median']:.1f} "
            f"| {delta} | {'yes' if r['identical_logits'] else 'no'} |"
        )
    if args.exact and not all(r["identical_logits"] for r in rows if not r["configs"]):
        print("a variant's logits differ from the plain build's (--no-exact to allow)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
