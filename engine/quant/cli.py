"""`nib quantize`: GPTQ-quantise a 16-bit model folder into a standard GPTQ checkpoint."""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from nib.engine.default_model import default_model_dir
from nib.engine.loader import load_model
from nib.engine.quant.calibrate import CALIBRATION_TEXT, calibration_samples, gptq_model
from nib.engine.quant.gptq_checkpoint import save_gptq_checkpoint
from nib.engine.tokenizer import Tokenizer

log = logging.getLogger("nib.quantize")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="nib quantize",
        description="GPTQ (4-bit, symmetric, group 128, no act-order) -> a GPTQ checkpoint "
        "that `nib serve --model OUT` runs on the INT4 kernels.",
    )
    p.add_argument("--model", type=Path, help="16-bit HF model folder (default: the shipped model)")
    p.add_argument("--out", type=Path, required=True, help="folder to write the checkpoint to")
    p.add_argument(
        "--calibration",
        type=Path,
        default=CALIBRATION_TEXT,
        help="calibration text (default: the shipped CPython-stdlib text; see its PROVENANCE.md)",
    )
    p.add_argument("--samples", type=int, default=128, help="calibration windows (default 128)")
    p.add_argument("--seq-len", type=int, default=512, help="tokens per window (default 512)")
    p.add_argument(
        "--damp", type=float, default=0.01, help="Hessian dampening, fraction of mean diag"
    )
    p.add_argument("--device", default="auto", help="cpu, cuda or auto")
    p.add_argument("--seed", type=int, default=0, help="seed for the calibration windows")
    p.add_argument("--log-level", default="INFO")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if args.samples < 1 or args.seq_len < 2:
        raise SystemExit("nib quantize: --samples must be >= 1 and --seq-len >= 2")
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    model_dir = args.model or default_model_dir()
    started = time.perf_counter()
    model = load_model(model_dir, dtype=torch.float32, device=device, quant="none")
    tok = Tokenizer(model_dir, model.cfg.eos_token_ids)
    ids = tok.encode(args.calibration.read_text(encoding="utf-8"))
    seq_len = min(args.seq_len, model.cfg.max_position_embeddings)
    samples = calibration_samples(ids, args.samples, seq_len, args.seed)
    log.info("calibrating on %d x %d tokens of %s", len(samples), seq_len, args.calibration)
    weights = gptq_model(model, samples, damp=args.damp)
    out = save_gptq_checkpoint(model_dir, args.out, weights)
    log.info("wrote %s in %.1fs", out, time.perf_counter() - started)
    print(out)
    return 0
