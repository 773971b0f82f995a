"""The voice example's sentence splitter, on deltas cut at awkward places."""

from __future__ import annotations

import importlib.util
from collections.abc import AsyncIterator
from pathlib import Path
from types import ModuleType

import pytest

PATH = Path(__file__).resolve().parents[2] / "examples" / "voice.py"


@pytest.fixture(scope="module")
def voice() -> ModuleType:
    spec = importlib.util.spec_from_file_location("voice_example", PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def split(voice: ModuleType, deltas: list[str], **kw: int) -> list[str]:
    async def gen() -> AsyncIterator[str]:
        for d in deltas:
            yield d

    return [s async for s in voice.sentences(gen(), **kw)]


async def test_sentences_end_at_punctuation_before_space(voice: ModuleType) -> None:
    deltas = [
        "A hash",
        " map stores keys. It",
        " hashes them",
        "! Lookups are O(1",
        ") on",
        " average.",
    ]
    assert await split(voice, deltas) == [
        "A hash map stores keys.",
        "It hashes them!",
        "Lookups are O(1) on average.",
    ]


async def test_a_period_inside_a_number_does_not_end_a_sentence(voice: ModuleType) -> None:
    assert await split(voice, ["Pi is 3", ".", "14 roughly. Yes"]) == ["Pi is 3.14 roughly.", "Yes"]


async def test_sentence_is_released_as_soon_as_it_is_complete(voice: ModuleType) -> None:
    released: list[str] = []

    async def gen() -> AsyncIterator[str]:
        yield "First one. Sec"
        assert released == ["First one."], "the first sentence must not wait for more text"
        yield "ond one"

    async for s in voice.sentences(gen()):
        released.append(s)
    assert released == ["First one.", "Second one"]


async def test_newlines_and_closing_quotes(voice: ModuleType) -> None:
    assert await split(voice, ['He said "stop." Then', " left\nBye"]) == [
        'He said "stop."',
        "Then left",
        "Bye",
    ]


async def test_long_text_without_an_end_is_cut_at_a_space(voice: ModuleType) -> None:
    words = ["word "] * 50
    out = await split(voice, words, max_chars=40)
    assert all(len(s) <= 40 for s in out) and " ".join(out).split() == ["word"] * 50
