"""Token healing: the prompt's last token is chosen again, and not repeated in the output."""

from __future__ import annotations

import queue

import pytest
import torch

from nib.engine.default_model import SHIPPED_MODEL
from nib.engine.engine import Engine, EngineConfig
from nib.engine.healing import HealedText, TokenHealer
from nib.engine.request import DoneEvent, Event, GenerationParams, Prompt
from nib.engine.tokenizer import Tokenizer

pytestmark = pytest.mark.skipif(
    not (SHIPPED_MODEL / "config.json").is_file(), reason="needs the shipped model"
)


@pytest.fixture(scope="module")
def healer() -> TokenHealer:
    tok = Tokenizer(SHIPPED_MODEL)
    return TokenHealer(tok, 8192, tok.special_ids())


def test_plain_prompt_backs_up_over_its_last_token(healer: TokenHealer) -> None:
    tok = healer.tokenizer
    ids = tok.encode("def f(n):\n    ")
    plan = healer.plan(ids)
    assert plan.prompt_ids == ids[:-1]
    assert plan.text == tok.decode(ids[-1:]) and plan.text.endswith("    ")


def test_infill_backs_up_over_the_last_prefix_token(healer: TokenHealer) -> None:
    tok = healer.tokenizer
    ids = tok.encode_infill("def f(n):\n    ret", "\n")
    suffix_at = ids.index(tok.token_id(tok.fim.suffix))  # type: ignore[union-attr]
    plan = healer.plan(ids)
    assert plan.prompt_ids == ids[: suffix_at - 1] + ids[suffix_at:]
    assert "ret".endswith(plan.text) or plan.text.endswith("ret")


def test_bias_allows_extensions_and_prefixes_only(healer: TokenHealer) -> None:
    bias = healer.bias("\n    ", torch.device("cpu"))
    allowed = {healer.texts[i] for i in torch.isfinite(bias).nonzero().flatten().tolist()}
    assert "\n    " in allowed and "\n   " in allowed and "\n" in allowed
    assert all(t.startswith("\n    ") or "\n    ".startswith(t) for t in allowed)
    assert " return" not in allowed


def test_healed_text_is_not_sent_twice() -> None:
    heal = HealedText("\n    ")
    assert heal("\n   ") == ""
    assert heal(" return x") == "return x"
    assert heal("\n") == "\n"  # nothing left to drop
    other = HealedText("ba")
    assert other("bar(") == "r("


def test_indented_prompt_gets_code_not_end_of_text() -> None:
    """Without healing the shipped model answers a fresh indented line with end-of-text."""
    outputs = {}
    for heal in (True, False):
        engine = Engine(EngineConfig(model_dir=SHIPPED_MODEL, token_healing=heal)).start()
        try:
            assert engine.wait_ready(60)
            events: queue.Queue[Event] = queue.Queue()
            prompt = engine.encode_prompt(
                Prompt(text="class Stack:\n    def __init__(self):\n        ")
            )
            engine.submit(prompt, GenerationParams(max_tokens=16), events.put, "h")
            text = ""
            while not isinstance(ev := events.get(timeout=60), DoneEvent):
                text += ev.text
            outputs[heal] = text
        finally:
            engine.stop()
    assert outputs[True].strip(), outputs
    assert not outputs[True].startswith(" "), "the healed indentation was repeated"


def test_the_bias_is_built_once_per_text_and_device_and_stays_bounded(
    healer: TokenHealer,
) -> None:
    """A repeated healed text reuses its tensor (on a GPU: no host-to-device copy per
    request); other texts get their own, and the cache keeps at most BIAS_CACHE."""
    from nib.engine.healing import BIAS_CACHE

    cpu = torch.device("cpu")
    first = healer.bias(" ", cpu)
    assert healer.bias(" ", cpu) is first
    other = healer.bias("    ", cpu)
    assert other is not first and not torch.equal(other, first)
    for i in range(BIAS_CACHE + 3):
        healer.bias("x" * (i + 1), cpu)
    assert len(healer._bias) == BIAS_CACHE
    # What the cache holds, as the stability bench reads it: full, and exactly its bound.
    assert healer.cached_bytes == healer.bound_bytes == BIAS_CACHE * first.numel() * 4
    rebuilt = healer.bias(" ", cpu)  # evicted long ago: built again, the same values
    assert rebuilt is not first and torch.equal(rebuilt, first)
