"""Held-out perplexity, bits per byte and sample completions.

`stream_loss` is the one definition of perplexity used everywhere: by the run
(on the whole held-out split and on the shipped held-out sample, which sets the
recorded bound) and by the CPU test that checks the shipped model through nib's
own loader. Windows of `window` tokens do not overlap; every token but the first
is predicted once, from the tokens before it in its window.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

# logits_fn(ids [b, t] int64) -> logits [b, t, vocab]
LogitsFn = Callable[[torch.Tensor], torch.Tensor]

PLAIN_PROMPTS = (
    "def fibonacci(n):\n",
    'import os\n\n\ndef list_python_files(root):\n    """Return the paths of all .py files under root."""\n',
    "class Stack:\n    def __init__(self):\n",
)
FIM_PROMPTS = (
    ("def is_even(n):\n    return ", "\n\n\nprint(is_even(4))\n"),
    (
        "import json\n\n\ndef read_json(path):\n    with open(path) as f:\n        ",
        "\n    return data\n",
    ),
)


@dataclass(frozen=True)
class LossReport:
    tokens: int  # predicted tokens
    bytes: int  # UTF-8 bytes those tokens stand for (special tokens count 0)
    nats: float
    window: int

    @property
    def loss(self) -> float:
        return self.nats / self.tokens

    @property
    def perplexity(self) -> float:
        return math.exp(self.loss)

    @property
    def bits_per_byte(self) -> float:
        return self.nats / math.log(2) / max(1, self.bytes)

    def as_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "loss": self.loss,
            "perplexity": self.perplexity,
            "bits_per_byte": self.bits_per_byte,
        }


@torch.no_grad()
def stream_loss(
    logits_fn: LogitsFn,
    ids: Sequence[int] | torch.Tensor,
    window: int,
    byte_lengths: Sequence[int],
    batch_size: int = 1,
    device: str | torch.device = "cpu",
) -> LossReport:
    """Summed next-token loss over non-overlapping windows of a token stream."""
    ids_t = torch.as_tensor(ids, dtype=torch.long)
    lengths = torch.as_tensor(byte_lengths, dtype=torch.long)
    if ids_t.numel() < 2:
        raise ValueError("need at least two tokens to measure a loss")
    starts = list(range(0, ids_t.numel() - 1, window))
    nats, tokens, nbytes = 0.0, 0, 0
    full = [s for s in starts if s + window + 1 <= ids_t.numel()]
    rest = [s for s in starts if s not in set(full)]
    groups = [full[i : i + batch_size] for i in range(0, len(full), batch_size)]
    groups += [[s] for s in rest]  # the short last window runs alone
    for group in groups:
        end = min(window, ids_t.numel() - 1 - group[0])
        batch = torch.stack([ids_t[s : s + end + 1] for s in group]).to(device)
        logits = logits_fn(batch[:, :-1]).float()
        target = batch[:, 1:]
        nats += float(
            F.cross_entropy(
                logits.reshape(-1, logits.size(-1)), target.reshape(-1), reduction="sum"
            )
        )
        tokens += target.numel()
        nbytes += int(lengths[target.cpu()].sum())
    return LossReport(tokens=tokens, bytes=nbytes, nats=nats, window=window)


def hf_logits_fn(model: torch.nn.Module) -> LogitsFn:
    def fn(ids: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = model(input_ids=ids, use_cache=False).logits
        return out

    return fn


def generate_samples(
    model_dir: Path, device: torch.device, max_new_tokens: int
) -> list[dict[str, Any]]:
    """Three plain and two fill-in-the-middle greedy completions, by transformers' generate
    from the saved folder in fp32 (the same weights and tokenizer that ship). Prompts are
    tokenised with `tokenizers` from tokenizer.json, as nib's engine does."""
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device).eval()

    def special(s: str) -> list[int]:
        i = tok.token_to_id(s)
        if i is None:
            raise KeyError(f"tokenizer lacks {s}")
        return [int(i)]

    def encode(text: str) -> list[int]:
        return list(tok.encode(text).ids)

    eos = special("<|endoftext|>")[0]
    cases: list[dict[str, Any]] = [{"kind": "plain", "prompt": p} for p in PLAIN_PROMPTS]
    cases += [{"kind": "fim", "prefix": p, "suffix": s} for p, s in FIM_PROMPTS]
    for case in cases:
        if case["kind"] == "plain":
            ids = encode(case["prompt"])
        else:
            ids = special("<|fim_prefix|>") + encode(case["prefix"])
            ids += special("<|fim_suffix|>") + encode(case["suffix"]) + special("<|fim_middle|>")
        prompt = torch.tensor([ids], device=device)
        with torch.no_grad():
            out = model.generate(
                prompt,
                attention_mask=torch.ones_like(prompt),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                eos_token_id=eos,
                pad_token_id=eos,
            )
        new = out[0, len(ids) :].tolist()
        finished = bool(new) and new[-1] == eos
        if finished:
            new = new[:-1]
        case["prompt_ids"] = ids
        case["completion_ids"] = new
        case["completion"] = tok.decode(new, skip_special_tokens=False)
        case["stopped_at_end_of_text"] = finished
    return cases


def autotokenizer_check(model_dir: Path) -> dict[str, Any]:
    """Does transformers.AutoTokenizer load the folder and split text as tokenizer.json does?"""
    try:
        from tokenizers import Tokenizer
        from transformers import AutoTokenizer

        hf = AutoTokenizer.from_pretrained(model_dir)
        raw = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        same = all(
            hf(p, add_special_tokens=False)["input_ids"] == raw.encode(p).ids for p in PLAIN_PROMPTS
        )
        return {"loads": True, "same_ids": same, "class": type(hf).__name__}
    except Exception as exc:  # recorded, not fatal: the weights are still worth returning
        return {"loads": False, "error": f"{type(exc).__name__}: {exc}"}
