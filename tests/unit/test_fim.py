"""One test per fill-in-the-middle family: detected from the tokenizer, laid out in order."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers

from nib.engine.fim import TEMPLATES
from nib.engine.tokenizer import Tokenizer


def _tokenizer_with(tmp_path: Path, specials: list[str]) -> Tokenizer:
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = HFTokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>", *specials])
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    return Tokenizer(path)


@pytest.mark.parametrize("template", TEMPLATES, ids=lambda t: t.family)
def test_family_is_detected_and_laid_out_prefix_suffix_middle(template, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    specials = [template.prefix, template.suffix, template.middle]
    specials += [t for t in (template.file_sep, template.end) if t]
    tok = _tokenizer_with(tmp_path, specials)
    assert tok.fim is not None and tok.fim.family == template.family
    ids = tok.encode_infill("def f(x):\n    return ", "\n\nprint(f(2))\n", path="src/f.py")
    p, s, m = (tok.token_id(t) for t in (template.prefix, template.suffix, template.middle))
    assert ids[-1] == m
    assert ids.index(p) < ids.index(s) < ids.index(m)
    assert tok.decode(ids[ids.index(p) + 1 : ids.index(s)]) == "def f(x):\n    return "
    assert tok.decode(ids[ids.index(s) + 1 : -1]) == "\n\nprint(f(2))\n"
    if template.file_sep:
        assert ids[0] == tok.token_id(template.file_sep)
        assert tok.decode(ids[1 : ids.index(p)]) == "src/f.py\n"
    else:
        assert ids[0] == p, "no path where the family has no token for it"
    if template.end:
        assert tok.token_id(template.end) in tok.eos_token_ids


def test_no_fim_tokens_means_no_infill(tmp_path: Path) -> None:
    tok = _tokenizer_with(tmp_path, [])
    assert tok.fim is None
    with pytest.raises(ValueError, match="no fill-in-the-middle tokens"):
        tok.encode_infill("a", "b")
