"""The tokenizer: byte-level BPE trained with Hugging Face `tokenizers` on the training split.

Byte-level means every string encodes (no unknown token) and every token is a
run of bytes, so a token's byte length is the length of its vocabulary string.
The special tokens take ids 0-4 in the order nib's engine expects
(engine/tokenizer.py looks them up by these exact strings).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from training.fim import EOT, FILE_SEP, MIDDLE, PREFIX, SUFFIX, SpecialIds
from training.split import stable_key

SPECIAL_TOKENS = (EOT, PREFIX, SUFFIX, MIDDLE, FILE_SEP)


def training_texts(texts: Sequence[tuple[str, str]], max_bytes: int) -> list[str]:
    """A deterministic subsample of (key, text) pairs, about max_bytes long, in key-hash order."""
    out, total = [], 0
    for _key, text in sorted(texts, key=lambda kt: stable_key("nib-tokenizer", kt[0])):
        if total >= max_bytes:
            break
        out.append(text)
        total += len(text)
    return out


def _batches(texts: list[str], size: int = 512) -> Iterator[list[str]]:
    for i in range(0, len(texts), size):
        yield texts[i : i + size]


def train_tokenizer(texts: list[str], vocab_size: int) -> Tokenizer:
    """Train byte-level BPE to exactly `vocab_size` entries (fewer if the text runs out)."""
    if vocab_size % 128:
        raise ValueError(f"vocab_size must be a multiple of 128, got {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_batches(texts), trainer, length=len(texts))
    for i, s in enumerate(SPECIAL_TOKENS):
        if tok.token_to_id(s) != i:
            raise RuntimeError(f"special token {s} got id {tok.token_to_id(s)}, expected {i}")
    return tok


def special_ids(tok: Tokenizer) -> SpecialIds:
    def get(s: str) -> int:
        i = tok.token_to_id(s)
        if i is None:
            raise KeyError(f"tokenizer lacks special token {s}")
        return int(i)

    return SpecialIds(get(EOT), get(PREFIX), get(SUFFIX), get(MIDDLE), get(FILE_SEP))


def token_byte_lengths(tok: Tokenizer) -> list[int]:
    """Bytes each id stands for (0 for special tokens), for bits-per-byte."""
    specials = set(SPECIAL_TOKENS)
    out = []
    for i in range(tok.get_vocab_size(with_added_tokens=True)):
        s = tok.id_to_token(i)
        out.append(0 if s is None or s in specials else len(s))
    return out


def save_tokenizer(tok: Tokenizer, out_dir: Path, model_max_length: int) -> list[Path]:
    """tokenizer.json plus the config files `transformers.AutoTokenizer` reads.

    The configs are written by hand in the long-standing format (PreTrainedTokenizerFast,
    additional_special_tokens) that transformers 4.x and 5.x both load.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    extra = [s for s in SPECIAL_TOKENS if s != EOT]
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": EOT,
        "pad_token": EOT,
        "additional_special_tokens": extra,
        "model_max_length": model_max_length,
        "clean_up_tokenization_spaces": False,
        "add_prefix_space": False,
    }
    special_map = {"eos_token": EOT, "pad_token": EOT, "additional_special_tokens": extra}
    files = [out_dir / "tokenizer.json"]
    for name, data in (
        ("tokenizer_config.json", config),
        ("special_tokens_map.json", special_map),
    ):
        (out_dir / name).write_text(json.dumps(data, indent=2) + "\n")
        files.append(out_dir / name)
    return files
