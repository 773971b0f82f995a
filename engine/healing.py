"""Token healing: do not make the model continue from a token boundary it never saw.

An editor's prompt ends wherever the cursor is: after the indentation of a new
line, halfway through a name. The tokenizer cuts that tail into a token the
model rarely saw in that place ("\\n    " where training text had "\\n   " +
" return"), and a small model often answers with end-of-text. So the engine
backs up over the prompt's last token and lets the model choose the first
token again, restricted to tokens that extend the removed text or are a
prefix of it; the part of the output that repeats the removed text is not
sent. For a fill-in-the-middle prompt the same is done to the last token of
the prefix.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

from nib.engine.tokenizer import Tokenizer

BIAS_CACHE = 16  # healed texts whose bias stays resident (a 152k vocabulary: 0.6 MB each)


@dataclass(frozen=True)
class HealPlan:
    prompt_ids: list[int]  # the prompt without the backed-up token
    text: str  # what that token spelled ("" when nothing was healed)


class TokenHealer:
    def __init__(self, tokenizer: Tokenizer, model_vocab: int, special_ids: set[int]) -> None:
        self.tokenizer = tokenizer
        self.model_vocab = model_vocab
        self.special = special_ids
        self.texts = [
            "" if i in special_ids else tokenizer.decode([i]) for i in range(tokenizer.vocab_size)
        ]
        fim = tokenizer.fim
        self.suffix_id = None if fim is None else tokenizer.token_id(fim.suffix)
        self.prefix_id = None if fim is None else tokenizer.token_id(fim.prefix)
        self._bias: OrderedDict[tuple[str, str], torch.Tensor] = OrderedDict()

    def _healable(self, token: int) -> str:
        if token in self.special or token >= len(self.texts):
            return ""
        text = self.texts[token]
        return "" if "\ufffd" in text else text

    def plan(self, prompt_ids: list[int]) -> HealPlan:
        """Back up over the last text token (of the prompt, or of an infill's prefix)."""
        if len(prompt_ids) < 2:
            return HealPlan(prompt_ids, "")
        at = len(prompt_ids) - 1
        if self.suffix_id is not None and prompt_ids[-1] in self.special:
            # An infill: the cursor is where the prefix ends, just before the suffix token.
            try:
                at = len(prompt_ids) - 1 - prompt_ids[::-1].index(self.suffix_id) - 1
            except ValueError:
                return HealPlan(prompt_ids, "")
            if at < 0 or prompt_ids[at] == self.prefix_id:
                return HealPlan(prompt_ids, "")
        text = self._healable(prompt_ids[at])
        if not text:
            return HealPlan(prompt_ids, "")
        return HealPlan(prompt_ids[:at] + prompt_ids[at + 1 :], text)

    @property
    def cached_bytes(self) -> int:
        """Device (or host) memory the cached biases hold: at most bound_bytes."""
        return sum(t.numel() * t.element_size() for t in self._bias.values())

    @property
    def bound_bytes(self) -> int:
        """What a full cache holds: BIAS_CACHE fp32 rows of the model's vocabulary."""
        return BIAS_CACHE * self.model_vocab * 4

    def bias(self, text: str, device: torch.device) -> torch.Tensor:
        """[model_vocab] fp32: 0 for tokens that extend `text` or are a prefix of it, -inf else.

        Kept on `device`, most recently used first: on a GPU a fresh copy per request
        was a synchronous 0.6 MB host-to-device copy (for a 152k vocabulary) on the time
        to first token, and a prompt ending in indentation heals the same few texts
        again and again. The caller must not write into the returned tensor."""
        key = (text, str(device))
        cached = self._bias.get(key)
        if cached is None:
            allowed = [
                i
                for i, t in enumerate(self.texts)
                if t and (t.startswith(text) or text.startswith(t))
            ]
            host = torch.full((self.model_vocab,), float("-inf"))
            host[allowed] = 0.0
            cached = host.to(device)
            self._bias[key] = cached
            if len(self._bias) > BIAS_CACHE:
                self._bias.popitem(last=False)
        self._bias.move_to_end(key)
        return cached


class HealedText:
    """Drops from the output stream the text that repeats what was healed."""

    def __init__(self, healed: str) -> None:
        self.remaining = healed

    def __call__(self, text: str) -> str:
        if not self.remaining or not text:
            return text
        if text.startswith(self.remaining):
            text, self.remaining = text[len(self.remaining) :], ""
            return text
        if self.remaining.startswith(text):
            self.remaining = self.remaining[len(text) :]
            return ""
        self.remaining = ""  # the model went elsewhere: nothing more to drop
        return text
