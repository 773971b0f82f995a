"""The bridge's pure parts: FIM windows, the token ratio, stop rules, settings."""

from __future__ import annotations

import pytest

from nib.bridge.context import TokenRatio, cut_prefix, cut_suffix, fim_window, prompt_token_budget
from nib.bridge.settings import BridgeSettings, apply
from nib.bridge.stops import StopRules, Truncator, bracket_excess, drop_overlap


def rules_at(text: str, mode: str = "auto") -> StopRules:
    offset = text.index("|")
    return StopRules.for_window(fim_window(text.replace("|", ""), offset, 10_000, 0.75), mode)


def complete(text_with_cursor: str, stream: list[str], mode: str = "auto") -> tuple[str, bool]:
    """(what the bridge would insert, whether it stopped the stream early)."""
    t = Truncator(rules_at(text_with_cursor, mode))
    early = any(t.feed(d) for d in stream)
    return t.result(), early


def test_window_within_budget_favours_the_prefix_and_cuts_at_lines() -> None:
    lines = [f"line {i:03d}\n" for i in range(100)]  # 9 characters each
    text = "".join(lines)
    offset = text.index("line 050")
    w = fim_window(text, offset, 90, 0.75)
    assert w.prefix == "".join(lines[43:50])  # 67 chars of budget -> 7 whole lines
    assert w.suffix == "".join(lines[50:52])  # 23 chars -> 2 whole lines
    assert len(w.prefix) + len(w.suffix) <= 90


def test_unused_budget_moves_to_the_other_side() -> None:
    text = "a" * 50 + "\n" + "b" * 10
    w = fim_window(text, len(text) - 5, 40, 0.5)
    # The suffix needs 5 of its 20; the prefix may take 35, but whole lines only.
    assert w.suffix == "bbbbb" and w.prefix == "bbbbb"
    w = fim_window(text, len(text) - 5, 61, 0.5)
    assert w.prefix == text[:-5]
    w = fim_window("x\n" + "y" * 100, 1, 40, 0.75)
    assert w.prefix == "x" and len(w.suffix) == 39


def test_cuts_keep_the_cursor_line_when_it_alone_is_longer_than_the_budget() -> None:
    assert cut_prefix("a" * 30, 10) == "a" * 10
    assert cut_prefix("abc\ndef\nghi", 6) == "ghi"
    assert cut_suffix("abc\ndef\nghi", 6) == "abc\n"
    assert cut_suffix("a" * 30, 10) == "a" * 10


def test_line_context_of_the_cursor() -> None:
    text = "def f(x):\n    return g(x)\n\nz = 1\n"
    w = fim_window(text, text.index("g(") + 2, 1000, 0.75)
    assert w.line_prefix == "    return g(" and w.line_suffix == "x)"
    assert w.next_lines[:2] == ("", "z = 1")


def test_token_ratio_learns_from_the_server() -> None:
    r = TokenRatio(2.5)
    r.observe(chars=1000, tokens=1000)  # a byte-level tokenizer
    assert r.value == 1.0
    r = TokenRatio(2.5)
    r.observe(chars=4000, tokens=1000)  # 4 chars per token: move up slowly, stay cautious
    assert 2.5 < r.value < 4.0
    r = TokenRatio(2.5)
    assert r.too_long(2500, "infill: is 2600 tokens; the context holds 2048 (prompt must ...)")
    assert r.value == pytest.approx(2500 / 2600 * 0.9)
    assert not r.too_long(10, "max_tokens: is 5000; must be at most 1024")
    assert prompt_token_budget(1024, 2048, 128, 10) == 1024
    assert prompt_token_budget(4096, 2048, 128, 10) == 2048 - 128 - 8 - 10


def test_single_line_stops_at_the_newline() -> None:
    assert complete("x = foo(|)", ["a, b", ")\n", "more"]) == ("a, b", True)
    assert complete("x = |", ["1", "\ny = 2"], mode="single") == ("1", True)


def test_auto_mode_is_multiline_only_with_nothing_right_of_the_cursor() -> None:
    assert rules_at("x = |").multiline and not rules_at("f(|)").multiline
    assert not rules_at("x = |", mode="single").multiline and rules_at("f(|)", "multi").multiline


def test_multiline_stops_where_the_cursors_block_ends() -> None:
    doc = "def f(x):\n    |\n"
    text, early = complete(doc, ["y = x + 1\n", "    return y\n", "print(f(1))\n", "more"])
    assert (text, early) == ("y = x + 1\n    return y", True)


def test_multiline_stops_at_a_blank_line_followed_by_a_dedent() -> None:
    doc = "class A:\n    def f(self):|\n"
    stream = ["\n        a = 1\n", "        return a\n", "\n", "    def g(self):\n", "        pass"]
    assert complete(doc, stream) == ("\n        a = 1\n        return a", True)


def test_blank_lines_inside_a_block_do_not_stop_it() -> None:
    doc = "def f():|\n"
    stream = ["\n    a = 1\n", "\n", "    b = 2\n", "    return a + b"]
    assert complete(doc, stream) == ("\n    a = 1\n\n    b = 2\n    return a + b", False)


def test_multiline_never_retypes_the_next_line_of_the_document() -> None:
    doc = "def f():\n    |\n    return total\n"
    stream = [
        "total = 0\n",
        "    for i in range(3):\n",
        "        total += i\n",
        "    return total\n",
    ]
    text, early = complete(doc, stream)
    assert text == "total = 0\n    for i in range(3):\n        total += i" and early


def test_a_first_line_that_retypes_the_next_line_gives_nothing() -> None:
    assert complete("def f():\n    |\n    return total\n", ["return total\n", "x"]) == ("", True)


def test_a_special_token_written_as_text_ends_the_completion() -> None:
    stream = ['ngs.txt")\n', "<|fim_mid", 'dle|>ngs.txt")']
    assert complete("def f():\n    x = open(|\n", stream, mode="multi") == ('ngs.txt")', True)
    assert complete("x = |", ["a<|endoftext|>b"], mode="single") == ("a", True)
    assert complete("x = |", ["a <div>|x|</div>"], mode="single")[0] == "a <div>|x|</div>"
    assert complete("x = |", ["a<|unused_7|>b"], mode="single")[0] == "a<|unused_7|>b"


def test_the_rest_of_the_line_is_not_duplicated() -> None:
    assert complete("print(|)", ["x)"]) == ("x", False)  # one ) is already there
    assert complete("print(foo(|)", ["x)"]) == ("x)", False)  # this ) closes foo
    assert complete("x = |;", ["1;"]) == ("1", False)
    assert complete('name = "|"', ['hello"']) == ("hello", False)
    assert drop_overlap("abc", "", "") == "abc"
    assert bracket_excess("f(x))") == 1 and bracket_excess("[(])") == 1


def test_settings_accept_both_shapes_and_report_bad_values() -> None:
    s, problems = apply(BridgeSettings(), {"maxTokens": 64, "debounceMs": 0})
    assert (s.max_tokens, s.debounce_ms, problems) == (64, 0, [])
    s, problems = apply(s, {"nib": {"mode": "multi", "maxTokens": "many", "colour": 1}})
    assert s.mode == "multi" and s.max_tokens == 64
    assert problems == [
        "setting maxTokens is 'many'; it must be 1 to 4096",
        "unknown setting 'colour' (known: address, apiKey, caFile, debounceMs, maxTokens, mode, "
        "prefixShare, promptTokens, temperature, timeoutS, tls)",
    ]
    assert apply(s, None) == (s, [])
    s, problems = apply(s, {"debounceMs": True})
    assert problems and s.debounce_ms == 0
