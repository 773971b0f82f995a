"""SessionTokens: the ids of an edited prompt without tokenising its unchanged part
again, always the ids of tokenising the whole text."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from tokenizers import Regex, decoders, models, pre_tokenizers, trainers
from tokenizers import Tokenizer as HFTokenizer

from nib.engine.default_model import byte_level_tokenizer, default_model_dir
from nib.engine.tokenizer import SessionTokens, Tokenizer

# Qwen2's pre-tokenizer: a regex split, then byte-level pieces without the GPT-2 regex.
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
CORPUS = [
    "def parse(line):\n    fields = line.split(',')\n    return fields[0]\n",
    "class Config:\n    def __init__(self, path):\n        self.path = path\n\n",
    "for i in range(10):\n\tprint(i)  # ünïcode ✓\n    x = {'a': 1}\n",
] * 20


def _qwen_like(tmp: Path) -> Path:
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>"],
    )
    tok.train_from_iterator(CORPUS, trainer)
    path = tmp / "qwen-like.json"
    tok.save(str(path))
    return path


@pytest.fixture(scope="module", params=["shipped", "bytes", "qwen2-like"])
def tokenizer(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Tokenizer:
    tmp = tmp_path_factory.mktemp("tok")
    if request.param == "shipped":
        return Tokenizer(default_model_dir())
    if request.param == "bytes":
        path = tmp / "bytes.json"
        byte_level_tokenizer().save(str(path))
        return Tokenizer(path)
    return Tokenizer(_qwen_like(tmp))


WORDS = ["def", "return", "x", "fields", "(", ")", ":", "=", " ", "  ", "'", "12345", "ü", "✓",
         "<|endoftext|>", ",", "\t", "#", "self.path", "''", "7", "\u00a0", "\u3000x",
         "\u2028", "\r\n", "'s"]  # fmt: skip
LINES = st.builds(
    lambda indent, words: indent + "".join(words),
    st.sampled_from(["", "", " ", "    ", "        ", "\t", "  \t", "\u00a0 ", "   "]),
    st.lists(st.sampled_from(WORDS), max_size=8),
)
DOCS = st.lists(LINES, min_size=1, max_size=60).map("\n".join)
EDITS = st.lists(
    st.tuples(
        st.sampled_from(["type", "type", "type", "newline", "edit_above", "delete", "paste"]),
        st.integers(0, 10_000),
        st.sampled_from([*WORDS, "\n", "\n    ", "\n\n"]),
    ),
    min_size=1,
    max_size=25,
)


def apply(doc: str, edit: tuple[str, int, str]) -> str:
    kind, where, text = edit
    if kind == "type":
        return doc + text
    if kind == "newline":
        return doc + "\n" + text.strip("\n")
    if kind == "delete":
        return doc[: -1 - where % 5] if len(doc) > 5 else doc
    if kind == "paste":
        return doc + "\n" + doc[: where % max(len(doc), 1)]
    at = where % max(len(doc), 1)  # edit_above: a change somewhere in the text
    return doc[:at] + text + doc[at:]


@settings(max_examples=300, deadline=None)
@given(doc=DOCS, edits=EDITS)
# An added token right after a newline ends the segment there: "\n\n" before it is one
# pre-token, before "<|endoftext|" (no longer the token) it is two.
@example(doc="def", edits=[("type", 0, "\n\n"), ("type", 0, "<|endoftext|>"), ("delete", 0, "")])
@example(doc="def", edits=[("type", 0, "\n\n<|endoftext|"), ("type", 0, ">")])
def test_an_edited_prompt_gets_the_ids_of_tokenising_it_whole(
    tokenizer: Tokenizer, doc: str, edits: list[tuple[str, int, str]]
) -> None:
    cache = SessionTokens(tokenizer, min_shared=16)
    for edit in [("type", 0, ""), *edits]:
        doc = apply(doc, edit)
        assert cache.encode(doc, "s") == tokenizer.encode(doc), edit


def test_typing_reuses_the_unchanged_part(tokenizer: Tokenizer) -> None:
    """A file typed at its end: after the first prompt, nearly nothing is tokenised again,
    and every prompt's ids are the whole text's."""
    source = (Path(__file__).parent.parent.parent / "engine" / "engine.py").read_text()[:6000]
    cache = SessionTokens(tokenizer)
    for cut in range(2000, 6000, 97):
        assert cache.encode(source[:cut], "editor") == tokenizer.encode(source[:cut])
    assert cache.splices >= 35
    assert cache.reused_bytes > 0.9 * sum(range(2000, 6000, 97)) - 41 * 2000


def test_no_session_or_other_tokenizers_tokenise_whole(tmp_path: Path) -> None:
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)  # GPT-2's option
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=400))
    tok.save(str(tmp_path / "t.json"))
    prefixed = Tokenizer(tmp_path / "t.json")
    assert prefixed.token_bytes() is None
    text = CORPUS[0] * 20
    cache = SessionTokens(prefixed, min_shared=16)
    for n in (400, 500, 600):
        assert cache.encode(text[:n], "s") == prefixed.encode(text[:n])
    assert cache.splices == 0
    shipped = SessionTokens(Tokenizer(default_model_dir()), min_shared=16)
    for n in (400, 500, 600):
        shipped.encode(text[:n])  # no session: nothing kept
    assert shipped.splices == 0 and not shipped._seen


def test_sessions_and_bytes_are_bounded() -> None:
    tok = Tokenizer(default_model_dir())
    cache = SessionTokens(tok, sessions=4, per_session=2, min_shared=16, max_bytes=60_000)
    text = CORPUS[0] * 40  # ~2.6 KB
    for s in range(10):
        for n in (1000, 1500, 2000):
            cache.encode(text[:n], f"s{s}")
    assert list(cache._seen) == ["s6", "s7", "s8", "s9"]
    assert all(len(e) <= 2 for e in cache._seen.values())
    small = SessionTokens(tok, min_shared=16, max_bytes=10_000)
    for s in range(10):
        small.encode(text, f"s{s}")
    assert len(small._seen) < 10 and small._bytes <= 10_000 + len(text) * 8


def test_reuse_is_faster_than_tokenising_whole() -> None:
    tok = Tokenizer(default_model_dir())
    source = (Path(__file__).parent.parent.parent / "engine" / "engine.py").read_text()
    source = (source * 2)[:32_000]
    cache = SessionTokens(tok)
    cache.encode(source[:-200], "e")
    started = time.perf_counter()
    for i in range(20):
        cache.encode(source[: len(source) - 200 + 10 * i], "e")
    reused = time.perf_counter() - started
    started = time.perf_counter()
    for i in range(20):
        tok.encode(source[: len(source) - 200 + 10 * i])
    whole = time.perf_counter() - started
    assert reused < whole / 3, (reused, whole)


def test_the_benchmark_replays_a_trace_and_checks_every_prompt(tmp_path: Path) -> None:
    import json
    import sys

    sys.path.insert(0, str(Path(__file__).parent.parent.parent / "bench"))
    from tokenize_reuse import main as bench

    assert bench(["--max-chars", "1200", "--out", str(tmp_path)]) == 0
    (result,) = tmp_path.glob("*-tokenize-reuse-cpu.json")
    (row,) = json.loads(result.read_text())["rows"]
    assert row["ids_equal"] and row["splices"] > 0 and row["prompts"] > 20
    assert row["session_us_median"] < row["whole_us_median"]


def test_the_engine_tokenises_a_session_prompt_by_reuse_with_the_same_ids() -> None:
    from nib.engine.engine import Engine, EngineConfig
    from nib.engine.request import Prompt

    engine = Engine(EngineConfig(model_dir=default_model_dir()))  # not started: no model
    source = (Path(__file__).parent.parent.parent / "engine" / "prefix_cache.py").read_text()
    for cut in (1500, 1540, 1600):
        infill = Prompt(prefix=source[:cut], suffix=source[cut : cut + 600], path="a.py")
        assert engine.encode_prompt(infill, "ed") == engine.encode_prompt(infill)
        text = Prompt(text=source[:cut])
        assert engine.encode_prompt(text, "ed") == engine.encode_prompt(text)
    assert engine.session_tokens.splices >= 2  # the prefix, at each cut after the first


def test_fresh_bytes_says_what_a_prompt_would_cost_to_tokenise() -> None:
    from nib.engine.engine import Engine, EngineConfig
    from nib.engine.request import Prompt

    engine = Engine(EngineConfig(model_dir=default_model_dir()))  # not started: no model
    source = (Path(__file__).parent.parent.parent / "engine" / "prefix_cache.py").read_text()
    first, longer = Prompt(text=source[:3000]), Prompt(text=source[:3040])
    assert engine.fresh_prompt_bytes(longer, "s") == len(source[:3040].encode())  # nothing kept
    engine.encode_prompt(first, "s")
    fresh = engine.fresh_prompt_bytes(longer, "s")
    assert 40 <= fresh < 400  # from the last line start before the change
    assert engine.fresh_prompt_bytes(first, "s") == 0  # the same text again
    assert engine.fresh_prompt_bytes(longer, "") == len(source[:3040].encode())
    infill = Prompt(prefix=source[:2000], suffix=source[2000:2600])  # within 1,024 tokens
    engine.encode_prompt(infill, "s")
    again = Prompt(prefix=source[:2040], suffix=source[2000:2600])
    assert engine.fresh_prompt_bytes(again, "s") < 400  # the suffix is spared whole
