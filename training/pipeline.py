"""The steps of run_all.py in order, each timed, against one wall-clock budget."""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import time
import traceback
from pathlib import Path
from typing import Any

import tokenizers
import torch
import transformers

from training import card
from training.bpe import (
    SPECIAL_TOKENS,
    save_tokenizer,
    token_byte_lengths,
    train_tokenizer,
    training_texts,
)
from training.checkpoint import save_model
from training.corpus import build_corpus, sample_text
from training.dataset import build_stream
from training.evaluate import autotokenizer_check, generate_samples, hf_logits_fn, stream_loss
from training.package import pack
from training.presets import Preset
from training.trainer import train

MODEL_NAME = "nib-tiny-code"
BOUND_FACTOR = 1.1


class RunLog:
    """Timestamped lines to stdout and to a file (the file ships with the model)."""

    def __init__(self, path: Path, started: float) -> None:
        self.path, self.started = path, started
        path.write_text("")

    def __call__(self, message: str) -> None:
        line = f"[{time.monotonic() - self.started:7.1f}s] {message}"
        print(line, flush=True)
        with self.path.open("a") as f:
            f.write(line + "\n")


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def run(
    preset: Preset,
    args: argparse.Namespace,
    work: Path,
    log: RunLog,
    command: str,
    started: float,
) -> int:
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if args.threads:
        torch.set_num_threads(args.threads)
    deadline = started + args.budget_s
    shape = preset.shape
    shape.validate()
    model_dir = work / MODEL_NAME
    if model_dir.exists():
        shutil.rmtree(model_dir)
    model_dir.mkdir(parents=True)
    device_name = (
        torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else platform.processor() or "CPU"
    )
    log(
        f"preset {preset.name} on {device} ({device_name}); {shape.num_parameters():,} parameters; budget {args.budget_s:.0f} s"
    )
    timings: dict[str, float] = {}
    mark = time.monotonic()

    def lap(name: str) -> None:
        nonlocal mark
        now = time.monotonic()
        timings[f"{name}_s"] = now - mark
        mark = now

    corpus = build_corpus(preset.corpus)
    manifest = corpus.manifest
    splits = manifest["splits"]
    _write_json(model_dir / "data_manifest.json", manifest)
    (model_dir / "heldout_sample.txt").write_text(sample_text(corpus.heldout_sample))
    (model_dir / "calibration_sample.txt").write_text(sample_text(corpus.calibration_sample))
    lap("corpus")
    log(
        f"corpus: train {splits['train']['files']} files {splits['train']['bytes'] / 1e6:.1f} MB, "
        f"held-out {splits['heldout']['files']} files {splits['heldout']['bytes'] / 1e6:.1f} MB "
        f"in {splits['heldout']['units']} units; {len(manifest['sources'])} sources, "
        f"{len(manifest['excluded_sources'])} excluded; {timings['corpus_s']:.1f} s"
    )

    texts = training_texts(
        [(f"{d.unit}/{d.relpath}", d.text) for d in corpus.train], preset.tokenizer_sample_bytes
    )
    tok = train_tokenizer(texts, shape.vocab_size)
    vocab = tok.get_vocab_size(with_added_tokens=True)
    if vocab > shape.vocab_size:
        raise RuntimeError(f"tokenizer has {vocab} entries, the model {shape.vocab_size}")
    save_tokenizer(tok, model_dir, shape.max_position_embeddings)
    lap("tokenizer")
    log(
        f"tokenizer: {vocab} entries from {sum(map(len, texts)) / 1e6:.1f} M chars; {timings['tokenizer_s']:.1f} s"
    )

    seed = preset.train.seed
    train_stream, train_stats = build_stream(
        tok, [(d.relpath, d.text) for d in corpus.train], preset.fim, seed
    )
    heldout_stream, heldout_stats = build_stream(
        tok, [(d.relpath, d.text) for d in corpus.heldout], None, seed
    )
    lap("pretokenise")
    log(
        f"streams: train {train_stats.tokens:,} tokens ({train_stats.fim_documents} of "
        f"{train_stats.documents} documents FIM), held-out {heldout_stats.tokens:,}; "
        f"{timings['pretokenise_s']:.1f} s"
    )

    seconds = args.train_seconds
    if seconds is None:
        seconds = deadline - time.monotonic() - preset.reserve_s
    if seconds <= 0:
        raise RuntimeError(f"no time left to train ({seconds:.0f} s): raise --budget-s")
    log(f"training for up to {seconds:.0f} s")
    result = train(
        shape,
        preset.train,
        train_stream,
        heldout_stream,
        eos_id=int(tok.token_to_id(SPECIAL_TOKENS[0])),
        device=device,
        seconds=seconds,
        steps=args.steps,
        log=log,
        warmup_steps=args.warmup_steps,
    )
    lap("train")
    assert result.model is not None
    shards = save_model(result.model, model_dir)
    result.model = None  # evaluation reloads the saved bf16 weights
    # Pack once now, so that a run killed during evaluation still returns the weights.
    shutil.copyfile(work / "train_log.txt", model_dir / "train_log.txt")
    pack(model_dir, args.out, extra=[work / "train_log.txt"])
    lap("save")
    log(f"saved {len(shards)} shards and packed them into {args.out}")

    metrics: dict[str, Any] = {
        "format": "nib-training-metrics/1",
        "command": command,
        "seed": seed,
        "preset": preset.name,
        "device_type": device.type,
        "model": {
            "name": MODEL_NAME,
            "parameters": shape.num_parameters(),
            "shape": shape.as_dict(),
            "linears": shape.linears(),
            "weights_dtype": "bfloat16",
            "weight_bytes": shape.weight_bytes(),
            "shards": len(shards),
        },
        "tokenizer": {
            "vocab_size": vocab,
            "trained_on_bytes": sum(len(t.encode("utf-8")) for t in texts),
            "special_tokens": list(SPECIAL_TOKENS),
            "chars_per_token": (
                sum(len(d.text) for d in corpus.heldout)
                / max(1, heldout_stats.tokens - len(corpus.heldout))
            ),
        },
        "data": {
            "fim": vars(preset.fim),
            "documents": train_stats.documents,
            "fim_documents": train_stats.fim_documents,
            "stream_tokens": train_stats.tokens,
            "heldout_tokens": heldout_stats.tokens,
        },
        "training": {**result.summary(), "config": vars(preset.train)},
        "environment": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
            "device": device_name,
        },
    }
    failed = False
    try:
        metrics["evaluation"] = evaluate(preset, model_dir, heldout_stream, tok, device, log)
        metrics["autotokenizer"] = autotokenizer_check(model_dir)
        log(f"transformers.AutoTokenizer: {metrics['autotokenizer']}")
        samples = generate_samples(model_dir, device, preset.sample_tokens)
        _write_json(model_dir / "samples.json", samples)
        lap("evaluate")
        metrics["timings"] = {**timings, "total_s": time.monotonic() - started}
        _write_json(model_dir / "metrics.json", metrics)
        (model_dir / "README.md").write_text(card.render(metrics, manifest, samples))
    except Exception:
        failed = True
        log("evaluation FAILED; packing the model without a card:\n" + traceback.format_exc())
        _write_json(model_dir / "metrics.json", metrics)
    shutil.copyfile(work / "train_log.txt", model_dir / "train_log.txt")
    written = pack(model_dir, args.out, extra=[work / "train_log.txt"])
    _summary(log, metrics, written, None if failed else samples)
    log(f"done in {time.monotonic() - started:.0f} s of {args.budget_s:.0f}")
    return 1 if failed else 0


def evaluate(
    preset: Preset,
    model_dir: Path,
    heldout_stream: Any,
    tok: tokenizers.Tokenizer,
    device: torch.device,
    log: RunLog,
) -> dict[str, Any]:
    """Held-out loss of the saved weights (bf16 on disk, evaluated in fp32)."""
    from transformers import AutoModelForCausalLM

    # Full fp32 (no TF32) so that the recorded bound compares like with like on a CPU.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device).eval()
    window = preset.train.seq_len
    lengths = token_byte_lengths(tok)
    fn = hf_logits_fn(model)
    ids = heldout_stream[: preset.max_eval_tokens].astype("int64")
    held = stream_loss(fn, ids, window, lengths, preset.eval_batch, device)
    sample_ids = tok.encode((model_dir / "heldout_sample.txt").read_text()).ids
    sample = stream_loss(fn, sample_ids, window, lengths, 1, device)
    log(
        f"held-out: perplexity {held.perplexity:.3f}, {held.bits_per_byte:.4f} bits/byte over "
        f"{held.tokens:,} tokens; heldout_sample.txt perplexity {sample.perplexity:.3f}"
    )
    return {
        "heldout": held.as_dict(),
        "heldout_sample": {
            **sample.as_dict(),
            "file": "heldout_sample.txt",
            "perplexity_bound": BOUND_FACTOR * sample.perplexity,
            "bound_rule": f"{BOUND_FACTOR} x the perplexity this run measured on the file, in fp32",
        },
    }


def _summary(
    log: RunLog, metrics: dict[str, Any], written: list[Path], samples: list[dict[str, Any]] | None
) -> None:
    tr = metrics["training"]
    lines = [
        "==== summary ====",
        f"parameters {metrics['model']['parameters']:,}; steps {tr['steps']:,}/{tr['planned_steps']:,}; "
        f"tokens {tr['tokens']:,} ({tr['epochs']:.2f} epochs, {tr['tokens_per_second']:,.0f} tok/s)",
    ]
    if tr["curve"]:
        last = tr["curve"][-1]
        lines.append(
            f"final train loss {last['train_loss']:.3f}, held-out loss {last['heldout_loss']:.3f}"
        )
    ev = metrics.get("evaluation")
    if ev:
        h, s = ev["heldout"], ev["heldout_sample"]
        lines.append(
            f"held-out perplexity {h['perplexity']:.3f}, {h['bits_per_byte']:.4f} bits/byte; "
            f"sample perplexity {s['perplexity']:.3f} (bound {s['perplexity_bound']:.3f})"
        )
    if "timings" in metrics:
        lines.append("timings: " + ", ".join(f"{k} {v:.1f}" for k, v in metrics["timings"].items()))
    for p in written:
        lines.append(f"out: {p.name} {p.stat().st_size:,} bytes")
    for s in samples or []:
        head = s.get("prompt") or f"<prefix>{s['prefix']}<suffix>{s['suffix']}"
        lines.append(f"sample {s['kind']}: {head!r} -> {s['completion']!r}")
    for line in lines:
        log(line)
