"""The trained tokenizer: special tokens where nib's engine looks, loadable by transformers."""

from __future__ import annotations

from pathlib import Path

import pytest

from training.bpe import SPECIAL_TOKENS, token_byte_lengths, train_tokenizer

from .training_fixtures import CODE, small_tokenizer


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tok")
    small_tokenizer(out)
    return out


def test_special_tokens_take_the_first_ids() -> None:
    tok = small_tokenizer()
    assert SPECIAL_TOKENS == (
        "<|endoftext|>",
        "<|fim_prefix|>",
        "<|fim_suffix|>",
        "<|fim_middle|>",
        "<|file_sep|>",
    )
    assert [tok.token_to_id(s) for s in SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
    assert tok.get_vocab_size() == 384
    # Special-token strings in the text are single tokens; the code around them is not merged in.
    ids = tok.encode("x<|fim_middle|>y").ids
    assert 3 in ids and len(ids) == 3


def test_vocab_must_be_a_multiple_of_128() -> None:
    with pytest.raises(ValueError, match="multiple of 128"):
        train_tokenizer(CODE, 300)


def test_byte_lengths_add_up() -> None:
    tok = small_tokenizer()
    lengths = token_byte_lengths(tok)
    text = 'print("héllo wörld €")\n\tx = 1  # ünïcode\n'
    ids = tok.encode(text).ids
    assert sum(lengths[i] for i in ids) == len(text.encode("utf-8"))
    assert lengths[:5] == [0] * 5


def test_transformers_autotokenizer_loads_it(tok_dir: Path) -> None:
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(tok_dir)
    raw = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    text = "def f(x):\n    return x  # é\n"
    assert hf(text, add_special_tokens=False)["input_ids"] == raw.encode(text).ids
    assert hf.eos_token == "<|endoftext|>" and hf.eos_token_id == 0
    assert set(SPECIAL_TOKENS) <= set(hf.all_special_tokens)
    assert hf.decode(raw.encode(text).ids) == text


def test_nib_engine_finds_the_fim_and_end_tokens(tok_dir: Path) -> None:
    from nib.engine.tokenizer import Tokenizer

    tok = Tokenizer(tok_dir)
    assert tok.fim is not None and tok.fim.family == "qwen2.5-coder"
    # End-of-text (0), and the FIM markers (1-4), which also end a completion.
    assert tok.eos_token_ids == frozenset({0, 1, 2, 3, 4})
    assert tok.token_id(tok.fim.file_sep or "") == 4
