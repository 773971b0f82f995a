"""The fill-in-the-middle prompt: a prefix and a suffix window around the cursor.

The windows are bounded in tokens, but the server owns the tokenizer, so the
bridge converts a token budget into characters with a chars-per-token ratio
that it learns from the server: every completion reports how many tokens its
prompt had (usage.prompt_tokens), and a prompt the server finds too long says
its token count in the error. The ratio starts low (code tokenizers average
3 to 4 characters per token), so the first prompt rarely overshoots.
Windows end on line boundaries where they can, and the prefix is favoured:
it gets `prefix_share` of the budget, plus whatever the suffix does not need.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

INITIAL_CHARS_PER_TOKEN = 2.5
# Room for the FIM special tokens and the file path the server adds to the prompt.
TEMPLATE_TOKENS = 8
_TOO_LONG = re.compile(r"is (\d+) tokens; the context holds (\d+)")


@dataclass(frozen=True)
class Window:
    prefix: str  # text before the cursor, cut to the budget
    suffix: str  # text after the cursor, cut to the budget
    line_prefix: str  # the cursor's line up to the cursor
    line_suffix: str  # the cursor's line after the cursor
    next_lines: tuple[str, ...]  # the next few lines after the cursor's line

    @property
    def chars(self) -> int:
        return len(self.prefix) + len(self.suffix)


def cut_prefix(before: str, budget: int) -> str:
    """The last `budget` characters of `before`, starting at a line start where possible."""
    if len(before) <= budget:
        return before
    window = before[len(before) - budget :]
    newline = window.find("\n")
    # Keep the partial first line only when the cursor's own line fills the window.
    return window[newline + 1 :] if newline != -1 else window


def cut_suffix(after: str, budget: int) -> str:
    """The first `budget` characters of `after`, ending at a line end where possible."""
    if len(after) <= budget:
        return after
    window = after[:budget]
    newline = window.rfind("\n")
    return window[: newline + 1] if newline > 0 else window


def fim_window(text: str, offset: int, budget_chars: int, prefix_share: float) -> Window:
    """Windows around `offset` (a character index into `text`) within `budget_chars`."""
    before, after = text[:offset], text[offset:]
    prefix_budget = int(budget_chars * prefix_share)
    suffix_budget = budget_chars - prefix_budget
    # What one side does not need, the other may use; the prefix first.
    if len(after) < suffix_budget:
        prefix_budget += suffix_budget - len(after)
        suffix_budget = len(after)
    elif len(before) < prefix_budget:
        suffix_budget += prefix_budget - len(before)
        prefix_budget = len(before)
    line_start = before.rfind("\n") + 1
    line_end = after.find("\n")
    rest = after[line_end + 1 :] if line_end != -1 else ""
    return Window(
        prefix=cut_prefix(before, max(prefix_budget, 0)),
        suffix=cut_suffix(after, max(suffix_budget, 0)),
        line_prefix=before[line_start:],
        line_suffix=after if line_end == -1 else after[:line_end],
        next_lines=tuple(rest.split("\n")[:8]),
    )


class TokenRatio:
    """Characters per token of the served model, learned from the server's answers."""

    def __init__(self, initial: float = INITIAL_CHARS_PER_TOKEN) -> None:
        self.value = initial

    def observe(self, chars: int, tokens: int) -> None:
        """A prompt of `chars` characters was `tokens` tokens (usage.prompt_tokens)."""
        if chars >= 200 and tokens > TEMPLATE_TOKENS:
            # Move towards what was seen, but stay on the cautious side of it.
            seen = chars / tokens
            self.value = min(seen, 0.7 * self.value + 0.3 * seen)

    def too_long(self, chars: int, message: str) -> bool:
        """Learn from 'is N tokens; the context holds M'; False if the message is not that."""
        match = _TOO_LONG.search(message)
        if match is None:
            return False
        self.value = min(self.value, max(chars, 1) / int(match.group(1)) * 0.9)
        return True

    def chars_for(self, tokens: int) -> int:
        return max(int(tokens * self.value), 0)


def prompt_token_budget(
    wanted: int, context_length: int, max_tokens: int, path_chars: int = 0
) -> int:
    """Tokens the prefix and suffix may take: the setting, capped by the model's context."""
    room = context_length - max_tokens - TEMPLATE_TOKENS - path_chars
    return max(min(wanted, room), 0)
