"""Incremental detokenising and stop strings, property-tested."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from nib.engine.default_model import byte_level_tokenizer
from nib.engine.tokenizer import IncrementalDetokenizer, StopMatcher, Tokenizer


def _tokenizer(tmp_path_factory) -> Tokenizer:  # type: ignore[no-untyped-def]
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    byte_level_tokenizer().save(str(path))
    return Tokenizer(path)


def test_streamed_text_equals_full_decode(tmp_path_factory) -> None:  # type: ignore[no-untyped-def]
    tok = _tokenizer(tmp_path_factory)

    @settings(max_examples=200, deadline=None)
    @given(st.text(alphabet=st.characters(codec="utf-8"), max_size=40))
    def check(text: str) -> None:
        ids = tok.encode(text)
        detok = IncrementalDetokenizer(tok)
        streamed = "".join(detok.push(i) for i in ids)
        assert streamed == text
        for piece_end in range(len(ids)):
            # Never a replacement character from a half-decoded UTF-8 sequence.
            assert "\ufffd" not in "".join(
                IncrementalDetokenizer(tok).push(i) for i in ids[:piece_end]
            )

    check()


def test_multibyte_character_waits_for_its_last_byte(tmp_path_factory) -> None:  # type: ignore[no-untyped-def]
    tok = _tokenizer(tmp_path_factory)
    ids = tok.encode("é€")
    assert len(ids) == 5  # byte-level: 2 + 3 bytes
    detok = IncrementalDetokenizer(tok)
    out = [detok.push(i) for i in ids]
    assert out == ["", "é", "", "", "€"]


@settings(max_examples=300, deadline=None)
@given(
    chunks=st.lists(st.text(alphabet="ab\n:x", max_size=5), max_size=12),
    stops=st.lists(st.text(alphabet="ab\n:", min_size=1, max_size=3), min_size=1, max_size=3),
)
def test_stop_matcher_emits_exactly_the_text_before_the_first_stop(
    chunks: list[str], stops: list[str]
) -> None:
    full = "".join(chunks)
    matcher = StopMatcher(tuple(stops))
    emitted, hit = "", None
    for chunk in chunks:
        text, hit = matcher.feed(chunk)
        emitted += text
        if hit is not None:
            break
    if hit is None:
        rest, hit = matcher.flush()
        emitted += rest
    first = min((i for s in stops if (i := full.find(s)) >= 0), default=None)
    # Reproduces a case hypothesis found: the stop that completes first is not the
    # one that starts first.
    if first is None:
        assert hit is None and emitted == full
    else:
        assert hit is not None and emitted == full[:first]
        assert full[first:].startswith(hit)


def test_stop_that_starts_first_wins_even_if_it_completes_later() -> None:
    matcher = StopMatcher(("a", "\naa"))
    out1 = matcher.feed("\na")
    out2 = matcher.feed("a")
    assert out1 == ("", None) and out2 == ("", "\naa")
    late = StopMatcher(("a", "\naa"))
    assert late.feed("\na") == ("", None)
    assert late.flush() == ("\n", "a")  # the longer stop never completed


def test_infill_prompt_uses_fim_tokens(tmp_path_factory) -> None:  # type: ignore[no-untyped-def]
    tok = _tokenizer(tmp_path_factory)
    ids = tok.encode_infill("def f(", "):\n    pass")
    fim = tok.fim
    assert fim is not None and fim.family == "qwen2.5-coder"
    assert ids[0] == tok.token_id(fim.prefix)
    assert ids[-1] == tok.token_id(fim.middle)
    assert tok.token_id(fim.suffix) in ids
    assert tok.decode(ids[1 : ids.index(tok.token_id(fim.suffix))]) == "def f("


def test_encode_gives_the_ids_of_the_full_encoding(tmp_path_factory) -> None:  # type: ignore[no-untyped-def]
    """Tokenizer.encode takes the offset-free path; its ids must be exactly what the
    full encoding gives, for the shipped model's BPE and the byte-level tokenizer."""
    from pathlib import Path

    from nib.engine.default_model import SHIPPED_MODEL

    toks = [_tokenizer(tmp_path_factory), Tokenizer(Path(SHIPPED_MODEL))]

    @settings(max_examples=300, deadline=None)
    @given(st.text(alphabet=st.characters(codec="utf-8"), max_size=200))
    def check(text: str) -> None:
        for tok in toks:
            assert tok.encode(text) == tok._tok.encode(text, add_special_tokens=False).ids

    check()
    code = "def quicksort(items):\n    if len(items) < 2:\n\treturn items  # ünïcode 🙂\n" * 8
    for tok in toks:
        assert tok.encode(code) == tok._tok.encode(code, add_special_tokens=False).ids
