"""Checks of a model folder made by training/run_all.py, shared by the smoke run's test
(a tiny model trained in the test) and the shipped model's test (engine/assets)."""

from __future__ import annotations

import json
import math
import queue
from pathlib import Path
from typing import Any

import torch

from training.evaluate import FIM_PROMPTS, PLAIN_PROMPTS, LossReport, stream_loss
from training.package import check_limits, verify_sums

REQUIRED = (
    "config.json",
    "generation_config.json",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "README.md",
    "data_manifest.json",
    "metrics.json",
    "samples.json",
    "heldout_sample.txt",
    "calibration_sample.txt",
    "train_log.txt",
    "SHA256SUMS",
)


def metrics(model_dir: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((model_dir / "metrics.json").read_text())
    return data


def check_files(model_dir: Path) -> None:
    """Layout, checksums, size rules, shape rules and a card that matches the run's records."""
    missing = [n for n in REQUIRED if not (model_dir / n).is_file()]
    assert not missing, f"missing {missing}"
    verify_sums(model_dir)
    assert check_limits(model_dir) <= 32 * 2**20
    index = json.loads((model_dir / "model.safetensors.index.json").read_text())
    assert {model_dir / f for f in index["weight_map"].values()} == set(
        model_dir.glob("model-*.safetensors")
    )
    cfg = json.loads((model_dir / "config.json").read_text())
    assert cfg["model_type"] == "llama" and cfg["tie_word_embeddings"] is True
    head_dim = cfg["head_dim"]
    for size in (
        cfg["hidden_size"],
        cfg["intermediate_size"],
        cfg["vocab_size"],
        cfg["num_attention_heads"] * head_dim,
        cfg["num_key_value_heads"] * head_dim,
    ):
        assert size % 128 == 0, f"{size} is not a multiple of 128"
    card = (model_dir / "README.md").read_text()
    samples = json.loads((model_dir / "samples.json").read_text())
    assert [s["kind"] for s in samples] == ["plain"] * 3 + ["fim"] * 2
    for s in samples:
        assert s["completion"] in card
    m = metrics(model_dir)
    assert m["autotokenizer"]["loads"] and m["autotokenizer"]["same_ids"], m["autotokenizer"]
    assert f"{m['evaluation']['heldout']['perplexity']:.3f}" in card
    assert m["command"] in card
    manifest = json.loads((model_dir / "data_manifest.json").read_text())
    assert manifest["splits"]["heldout"]["files"] > 0 and manifest["splits"]["train"]["files"] > 0


def hf_greedy(model_dir: Path, prompt_ids: list[int], n: int) -> list[int]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    eos = model.generation_config.eos_token_id
    prompt = torch.tensor([prompt_ids])
    with torch.no_grad():
        out = model.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=n,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=eos,
        )
    new: list[int] = out[0, len(prompt_ids) :].tolist()
    return new[: new.index(eos)] if eos in new else new


def nib_greedy(model_dir: Path, n: int) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, greedy completion ids) from nib's engine for the card's five prompts."""
    from nib.engine.engine import Engine, EngineConfig
    from nib.engine.request import DoneEvent, Event, GenerationParams, Prompt, TokenEvent

    # Plain greedy decoding, as transformers does it: no token healing.
    engine = Engine(EngineConfig(model_dir=model_dir, token_healing=False)).start()
    try:
        assert engine.wait_ready(120), engine.failure
        prompts = [Prompt(text=p) for p in PLAIN_PROMPTS]
        prompts += [Prompt(prefix=p, suffix=s) for p, s in FIM_PROMPTS]
        results = []
        for i, prompt in enumerate(prompts):
            ids = engine.encode_prompt(prompt)
            events: queue.Queue[Event] = queue.Queue()
            engine.submit(ids, GenerationParams(max_tokens=n), events.put, f"check-{i}")
            tokens: list[int] = []
            while not isinstance(ev := events.get(timeout=120), DoneEvent):
                assert isinstance(ev, TokenEvent)
                tokens.extend(ev.token_ids)
            results.append((ids, tokens))
        return results
    finally:
        engine.stop()


def check_nib_matches_transformers(model_dir: Path, n: int = 24) -> None:
    from transformers import AutoTokenizer

    hf_tok = AutoTokenizer.from_pretrained(model_dir)
    results = nib_greedy(model_dir, n)
    for prompt, (ids, _) in zip(PLAIN_PROMPTS, results, strict=False):
        assert ids == hf_tok(prompt, add_special_tokens=False)["input_ids"]
    # nib ends a completion at end-of-text and at FIM markers (Tokenizer.eos_token_ids);
    # transformers only knows end-of-text, so compare up to nib's first stop.
    from nib.engine.tokenizer import Tokenizer

    stops = Tokenizer(model_dir).eos_token_ids
    for ids, tokens in results:
        reference = hf_greedy(model_dir, ids, n)
        cut = next((i for i, t in enumerate(reference) if t in stops), len(reference))
        assert tokens == reference[:cut]
    assert any(tokens for _, tokens in results), "no prompt produced a single token"


def nib_heldout_perplexity(model_dir: Path) -> tuple[LossReport, float]:
    """Perplexity of heldout_sample.txt through nib's loader and tokenizer, in fp32 on the CPU,
    and the bound the training run recorded."""
    from tokenizers import Tokenizer as RawTokenizer

    from nib.engine.loader import load_model
    from nib.engine.tokenizer import Tokenizer
    from training.bpe import token_byte_lengths

    sample = metrics(model_dir)["evaluation"]["heldout_sample"]
    window = int(sample["window"])
    model = load_model(model_dir)
    model.setup_cache(window)
    ids = Tokenizer(model_dir).encode((model_dir / sample["file"]).read_text())
    lengths = token_byte_lengths(RawTokenizer.from_file(str(model_dir / "tokenizer.json")))

    def logits(x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = model(x, torch.arange(x.shape[1]), x.shape[1])
        return out

    report = stream_loss(logits, ids, window, lengths)
    assert report.tokens == sample["tokens"], "the tokenizer splits the sample differently"
    bound = float(sample["perplexity_bound"])
    assert math.isfinite(bound) and bound > 1.0
    return report, bound
