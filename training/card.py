"""The model card (README.md of the model folder), rendered from what the run measured.

Every number here comes from metrics.json and the corpus manifest written by the
same run; the sample completions are the run's own greedy outputs, verbatim.
"""

from __future__ import annotations

from typing import Any


def _mib(n: float) -> str:
    return f"{n / 2**20:.2f} MiB"


def _mb(n: float) -> str:
    return f"{n / 1e6:.1f} MB"


def _n(count: int, noun: str) -> str:
    return f"{count:,} {noun}" + ("" if count == 1 else "s")


def _times(n: int) -> str:
    return {1: "once", 2: "twice"}.get(n, f"{n} times")


def _fence(text: str) -> str:
    fence = "```"
    while fence in text:
        fence += "`"
    return f"{fence}python\n{text}\n{fence}"


def _curve_rows(curve: list[dict[str, Any]], rows: int = 10) -> list[str]:
    if not curve:
        return ["(no measurements)"]
    picks = sorted({round(i * (len(curve) - 1) / max(1, rows - 1)) for i in range(rows)})
    out = [
        "| step | tokens | seconds | lr | train loss | held-out loss |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for i in picks:
        p = curve[i]
        out.append(
            f"| {p['step']} | {p['tokens']:,} | {p['seconds']:.0f} | {p['lr']:.2e} | "
            f"{p['train_loss']:.3f} | {p['heldout_loss']:.3f} |"
        )
    return out


def _samples(samples: list[dict[str, Any]]) -> list[str]:
    out: list[str] = []
    for n, s in enumerate(samples, start=1):
        end = "stopped at <|endoftext|>" if s["stopped_at_end_of_text"] else "hit the token limit"
        tokens = len(s["completion_ids"])
        if s["kind"] == "plain":
            out += [f"### {n}. Plain completion", "", "Prompt:", "", _fence(s["prompt"]), ""]
        else:
            out += [f"### {n}. Fill in the middle", "", "Prefix:", "", _fence(s["prefix"]), ""]
            out += ["Suffix:", "", _fence(s["suffix"]), ""]
        out += [f"Completion ({tokens} tokens, {end}):", "", _fence(s["completion"]), ""]
    return out


def render(metrics: dict[str, Any], manifest: dict[str, Any], samples: list[dict[str, Any]]) -> str:
    m, tr, ev = metrics["model"], metrics["training"], metrics["evaluation"]
    data, tok, env = metrics["data"], metrics["tokenizer"], metrics["environment"]
    shape = m["shape"]
    splits = manifest["splits"]
    held, sample = ev["heldout"], ev["heldout_sample"]
    lines = [
        "---",
        "license: apache-2.0",
        "library_name: transformers",
        "pipeline_tag: text-generation",
        "tags: [code, python, fill-in-the-middle, nib]",
        "---",
        "",
        f"# {m['name']}",
        "",
        "A tiny Llama-architecture Python code model trained from scratch by nib's own script "
        "(`training/run_all.py`) on permissively licensed Python source found on the training "
        "host. It is `nib serve`'s default model: small enough to run on a laptop CPU, trained "
        "enough to produce Python rather than noise, and the quality yardstick for nib's INT4 "
        "path. It is not a capable assistant: expect plausible, often wrong, short completions.",
        "",
        "## Model",
        "",
        "| | |",
        "|---|---|",
        f"| architecture | `LlamaForCausalLM` (RMSNorm, RoPE θ={shape['rope_theta']:g}, GQA, SwiGLU) |",
        f"| parameters | {m['parameters']:,} (embeddings tied with the output layer) |",
        f"| layers × hidden | {shape['num_layers']} × {shape['hidden_size']} |",
        f"| attention | {_n(shape['num_heads'], 'head')} of {shape['head_dim']}, "
        f"{_n(shape['num_kv_heads'], 'key/value head')} |",
        f"| MLP | {shape['intermediate_size']} (SwiGLU) |",
        f"| vocabulary | {shape['vocab_size']} (byte-level BPE) |",
        f"| context | {shape['max_position_embeddings']} positions; trained on windows of "
        f"{tr['config']['seq_len']} tokens |",
        f"| weights | {m['weights_dtype']}, {_mib(m['weight_bytes'])} in {_n(m['shards'], 'safetensors shard')} |",
        "",
        "Every linear layer's input and output size is a multiple of 128 (the INT4 group size): "
        + ", ".join(f"{k} {i}→{o}" for k, (i, o) in m["linears"].items())
        + ".",
        "",
        "## Training data",
        "",
        f"Python source files (`.py`) of the training host's standard library (Python "
        f"{env['python']}) and of its installed distributions whose metadata declares a "
        "permissive licence (MIT, BSD, Apache-2.0, PSF, ISC and similar; read from "
        "`License-Expression`, else the licence classifiers and `License` field). Copyleft or "
        "unknown licences were excluded. Files over "
        f"{manifest['config']['max_file_bytes']:,} bytes, with a line over "
        f"{manifest['config']['max_line_chars']} characters, not UTF-8, nearly empty or "
        "declaring themselves generated were dropped; exact duplicates after normalising line "
        "ends and trailing whitespace were removed. The full list is in `data_manifest.json`.",
        "",
        "| split | files | bytes | units | sha256 of the concatenated split |",
        "|---|---:|---:|---:|---|",
    ]
    for name in ("train", "heldout"):
        s = splits[name]
        lines.append(
            f"| {name} | {s['files']:,} | {_mb(s['bytes'])} | {s['units']} | `{s['sha256'][:16]}…` |"
        )
    lines += [
        "",
        f"Held out by unit, not by line: {manifest['split_rule']}. Held-out units: "
        + ", ".join(f"`{u}`" for u in splits["heldout"]["unit_names"])
        + ".",
        "",
        "Dropped files: "
        + ", ".join(f"{k} {v}" for k, v in manifest["dropped_files"].items())
        + ". Excluded distributions: "
        + (
            ", ".join(f"{e['name']} ({e['license']})" for e in manifest["excluded_sources"])
            or "none"
        )
        + ".",
        "",
        "| source | version | licence | train files | held-out files |",
        "|---|---|---|---:|---:|",
    ]
    for s in manifest["sources"]:
        lines.append(
            f"| {s['name']} | {s['version']} | {s['license']} | {s['train_files']} | {s['heldout_files']} |"
        )
    lines += [
        "",
        "## Tokenizer",
        "",
        f"Byte-level BPE trained with Hugging Face `tokenizers` on {_mb(tok['trained_on_bytes'])} "
        f"of the training split: {tok['vocab_size']} entries, {tok['chars_per_token']:.2f} "
        "characters per token on the held-out split. Special tokens (ids 0-4): "
        + ", ".join(f"`{t}`" for t in tok["special_tokens"])
        + ". `tokenizer.json`, `tokenizer_config.json` and `special_tokens_map.json` load with "
        "`transformers.AutoTokenizer` and nib's engine.",
        "",
        "## Training",
        "",
        f"From scratch on {env['device']}, {tr['seconds']:.0f} s of training "
        f"({tr['steps']:,} steps of {tr['config']['batch_size']} × {tr['config']['seq_len']} tokens = "
        f"{tr['tokens']:,} tokens, {tr['epochs']:.2f} passes over the {data['stream_tokens']:,}-token "
        f"training stream, {tr['tokens_per_second']:,.0f} tokens/s)"
        + (", stopped early by the deadline" if tr["stopped_by_deadline"] else "")
        + f". AdamW (β {tr['config']['beta1']}, {tr['config']['beta2']}, weight decay "
        f"{tr['config']['weight_decay']}), peak learning rate {tr['config']['lr']:g} with "
        f"{tr['warmup_steps']:,} steps of linear warmup and cosine decay to "
        f"{tr['config']['min_lr_ratio']:g}×, gradient clipping at {tr['config']['grad_clip']}, "
        f"{'bf16 autocast' if metrics['device_type'] == 'cuda' else 'fp32'}, seed {metrics['seed']}.",
        "",
        f"Sequences are packed: documents separated by `<|endoftext|>`, cut into windows of "
        f"{tr['config']['seq_len']} tokens. Fill-in-the-middle: the corpus is laid out "
        f"{_times(data['fim']['variants'])}; in each layout a document is rearranged "
        f"prefix-suffix-middle with probability {data['fim']['rate']:g} (cut at two random "
        f"characters: `<|fim_prefix|>pre<|fim_suffix|>suf<|fim_middle|>mid<|endoftext|>`), "
        f"so {data['fim_documents']:,} of {data['documents']:,} laid-out documents are FIM; "
        f"{data['fim']['path_rate']:.0%} start with `<|file_sep|>path` and a newline.",
        "",
        *_curve_rows(tr["curve"]),
        "",
        (
            f"The shipped weights are those of step {tr['selected_step']:,}, the measurement "
            "with the lowest held-out loss"
            + (" (the last one)." if tr["selected_step"] == tr["steps"] else ".")
        ),
        f"To repeat this schedule exactly, add `--steps {tr['planned_steps']} --warmup-steps "
        f"{tr['warmup_steps']}` to the command (on a host whose corpus has the same sha256).",
        "",
        "Exact command (the whole pipeline: corpus, tokenizer, training, evaluation, this card):",
        "",
        "```sh",
        metrics["command"],
        "```",
        "",
        "Wall clock: "
        + ", ".join(f"{k.removesuffix('_s')} {v:.0f} s" for k, v in metrics["timings"].items())
        + f". Software: torch {env['torch']}, transformers {env['transformers']}, "
        f"tokenizers {env['tokenizers']}.",
        "",
        "## Evaluation",
        "",
        f"On the whole held-out split ({held['tokens']:,} tokens, windows of {held['window']}, "
        f"fp32 from the shipped bf16 weights): perplexity **{held['perplexity']:.3f}**, "
        f"**{held['bits_per_byte']:.4f} bits per byte** (loss {held['loss']:.4f} nats/token).",
        "",
        f"On `heldout_sample.txt` ({sample['tokens']:,} tokens; shipped so that CI can re-measure "
        f"it on a CPU): perplexity {sample['perplexity']:.3f}, {sample['bits_per_byte']:.4f} bits "
        f"per byte. The recorded bound for that test is {sample['perplexity_bound']:.3f} "
        f"({sample['bound_rule']}).",
        "",
        "## Sample completions",
        "",
        "Greedy, from this folder loaded by `transformers` in fp32, copied verbatim from the run "
        "(`samples.json` holds the token ids).",
        "",
        *_samples(samples),
        "## Files",
        "",
        "- `config.json`, `generation_config.json`, `model-*.safetensors`, "
        "`model.safetensors.index.json`: the model in Hugging Face layout",
        "- `tokenizer.json`, `tokenizer_config.json`, `special_tokens_map.json`: the tokenizer",
        "- `data_manifest.json`: sources, versions, licences, file counts, bytes, split hashes",
        "- `metrics.json`: every number on this card; `samples.json`: the completions above",
        "- `heldout_sample.txt`: held-out code for the CPU perplexity test; "
        "`calibration_sample.txt`: training-split code for INT4 (GPTQ) calibration. Both are "
        "whole documents joined by `<|endoftext|>`; their provenance is listed in "
        "`data_manifest.json` under `samples`",
        "- `train_log.txt`: the run's log; `SHA256SUMS`: checksums of every file",
        "",
    ]
    return "\n".join(lines)
