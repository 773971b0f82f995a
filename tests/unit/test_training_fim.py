"""Fill-in-the-middle layout and the pre-tokenised stream the model trains on."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from training.bpe import special_ids
from training.dataset import ChunkSampler, FimConfig, build_stream
from training.fim import Layout, assemble, fim_pieces, layout, psm_text, split_points

from .training_fixtures import small_tokenizer

TOK = small_tokenizer()
IDS = special_ids(TOK)


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=200), seed=st.integers(0, 2**32))
def test_cut_points_keep_every_character(text: str, seed: int) -> None:
    a, b = split_points(len(text), random.Random(seed))
    assert 0 <= a <= b <= len(text)
    prefix, suffix, middle = fim_pieces(text, a, b)
    assert prefix + middle + suffix == text


def test_bad_cut_points_are_rejected() -> None:
    with pytest.raises(ValueError, match="cut points"):
        fim_pieces("abc", 2, 1)


def test_psm_order_and_path_header() -> None:
    lay = Layout(True, ("pre", "suf", "mid"), "pkg/mod.py")
    assert psm_text(lay) == (
        "<|file_sep|>pkg/mod.py\n<|fim_prefix|>pre<|fim_suffix|>suf<|fim_middle|>mid<|endoftext|>"
    )
    assert psm_text(Layout(False, ("body",))) == "body<|endoftext|>"


@settings(max_examples=60, deadline=None)
@given(
    text=st.text(alphabet=st.characters(codec="utf-8", exclude_characters="<|"), max_size=120),
    seed=st.integers(0, 10**6),
    fim=st.booleans(),
    path=st.sampled_from([None, "a/b.py"]),
)
def test_separately_tokenised_pieces_equal_the_psm_text(
    text: str, seed: int, fim: bool, path: str | None
) -> None:
    lay = layout(text, fim, random.Random(seed), path)
    pieces = [TOK.encode(p).ids for p in lay.pieces]
    path_ids = TOK.encode(path + "\n").ids if path else None
    # The path header is tokenised on its own (see the test below); the rest as one text.
    header = f"<|file_sep|>{path}\n" if path else ""
    whole = psm_text(lay)
    assert whole.startswith(header)
    expected = (TOK.encode(header).ids if header else []) + TOK.encode(whole[len(header) :]).ids
    assert assemble(lay, pieces, path_ids, IDS) == expected


def test_a_path_header_does_not_merge_into_a_plain_document() -> None:
    """A plain document that starts with a newline keeps its own newline token after the
    header's, as nib's engine encodes `path + "\n"` apart from what follows; tokenising
    the joined text would merge the two newlines (Hypothesis once found text='\n')."""
    lay = layout("\n", False, random.Random(0), "a/b.py")
    pieces = [TOK.encode(p).ids for p in lay.pieces]
    path_ids = TOK.encode("a/b.py\n").ids
    ids = assemble(lay, pieces, path_ids, IDS)
    assert ids == [IDS.file_sep, *path_ids, *pieces[0], IDS.eot]
    assert ids != TOK.encode(psm_text(lay)).ids  # the joined text merges "\n\n"


def test_training_layout_matches_the_engines_infill_prompt(tmp_path: Path) -> None:
    """What the model learns to continue is exactly what nib's engine sends it."""
    from nib.engine.tokenizer import Tokenizer

    small_tokenizer(tmp_path)
    engine_tok = Tokenizer(tmp_path)
    prefix, suffix, path = "def f(x):\n    return ", "\n\nprint(f(2))\n", "src/app.py"
    for p in ("", path):
        lay = Layout(True, (prefix, suffix, ""), p or None)
        pieces = [TOK.encode(s).ids for s in lay.pieces]
        trained = assemble(lay, pieces, TOK.encode(p + "\n").ids if p else None, IDS)
        # The training document then continues with the middle and <|endoftext|>.
        assert engine_tok.encode_infill(prefix, suffix, p) == trained[:-1]


DOCS = [
    (f"pkg/m{i}.py", f"def f{i}(x):\n    return x * {i}  # <|endoftext|> as text\n")
    for i in range(40)
]


def test_stream_of_plain_documents_round_trips() -> None:
    stream, stats = build_stream(TOK, DOCS, None, seed=0)
    assert stats.fim_documents == 0 and stats.documents == len(DOCS)
    # The special-token string inside the code is text, so <|endoftext|> ends documents only.
    assert int((stream == IDS.eot).sum()) == len(DOCS)
    assert TOK.decode(stream.tolist(), skip_special_tokens=False) == "".join(
        text + "<|endoftext|>" for _, text in DOCS
    )


def test_two_variants_show_every_document_once_whole_and_once_fim() -> None:
    stream, stats = build_stream(TOK, DOCS, FimConfig(rate=0.5, variants=2, path_rate=0.0), 7)
    assert stats.documents == 2 * len(DOCS) and stats.fim_documents == len(DOCS)
    assert int((stream == IDS.prefix).sum()) == len(DOCS)
    assert int((stream == IDS.file_sep).sum()) == 0
    text = TOK.decode(stream.tolist(), skip_special_tokens=False)
    for _, doc in DOCS:
        whole = doc + "<|endoftext|>"
        assert text.count(whole) >= 1  # laid out whole in one of the two variants
    again, _ = build_stream(TOK, DOCS, FimConfig(rate=0.5, variants=2, path_rate=0.0), 7)
    assert np.array_equal(stream, again)


def test_path_headers_follow_the_rate() -> None:
    stream, _ = build_stream(TOK, DOCS, FimConfig(rate=0.0, variants=1, path_rate=1.0), 0)
    assert int((stream == IDS.file_sep).sum()) == len(DOCS)
    text = TOK.decode(stream.tolist(), skip_special_tokens=False)
    assert "<|file_sep|>pkg/m3.py\ndef f3(x)" in text


def test_sampler_windows_are_shifted_by_one_and_cover_an_epoch() -> None:
    stream = np.arange(1000, dtype=np.uint16)
    sampler = ChunkSampler(stream, seq_len=10, batch_size=4, device=torch.device("cpu"), seed=0)
    seen = []
    while sampler.epoch < 1:
        x, y = sampler.next_batch()
        assert torch.equal(x[:, 1:], y[:, :-1]) and torch.equal(y - x, torch.ones_like(x))
        if sampler.epoch == 0:
            seen.extend(x[:, 0].tolist())
    assert len(seen) == len(set(seen)) >= 90  # each window once per epoch
    with pytest.raises(ValueError, match="shorter than one batch"):
        ChunkSampler(stream[:30], seq_len=10, batch_size=4, device=torch.device("cpu"), seed=0)
