"""Where a completion ends, judged as the text streams in, so the server can stop early.

- Single-line: at the first newline (the server is also given "\\n" as a stop).
- Multi-line: where the cursor's block ends: before the first line indented
  less than the cursor's line, or at a blank line followed by a line indented
  less than the line before the blank (the end of a block the completion opened).
- At a FIM or document marker such as `<|fim_middle|>` or `<|endoftext|>` that a model
  writes as text: it is never code, and it means the model lost its place.
- Never duplicate what is already there: a multi-line completion stops before
  a line that repeats the next line of the document; the end of the text that
  repeats the rest of the cursor's line is dropped (closing brackets only when
  they would otherwise be unbalanced).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from nib.bridge.context import Window

TAB_WIDTH = 4
# The tokens that delimit documents and FIM parts in Qwen/StarCoder-style vocabularies
# (nib's own among them), as a model that writes them as text spells them.
SPECIAL_MARKER = re.compile(r"<\|(?:fim_[a-z]+|endoftext|file_sep|repo_name|im_start|im_end)\|>")
_PAIRS = {")": "(", "]": "[", "}": "{"}


def indent_width(line: str) -> int:
    stripped = line[: len(line) - len(line.lstrip(" \t"))]
    return len(stripped.expandtabs(TAB_WIDTH))


@dataclass(frozen=True)
class StopRules:
    multiline: bool
    block_indent: int  # columns of the cursor's line indentation
    line_prefix: str
    line_suffix: str
    next_line: str  # the first non-blank line after the cursor's line, stripped

    @classmethod
    def for_window(cls, window: Window, mode: str) -> StopRules:
        multiline = mode == "multi" or (mode == "auto" and not window.line_suffix.strip())
        lp = window.line_prefix
        # On a line of only whitespace the cursor column is where the block is.
        indent = len(lp.expandtabs(TAB_WIDTH)) if not lp.strip() else indent_width(lp)
        next_line = next((line.strip() for line in window.next_lines if line.strip()), "")
        return cls(multiline, indent, lp, window.line_suffix, next_line)


class Truncator:
    """Feed deltas; `stopped` turns True once the completion reached its end."""

    def __init__(self, rules: StopRules) -> None:
        self.rules = rules
        self.raw = ""
        self.stopped = False
        self._cut: int | None = None

    def feed(self, delta: str) -> bool:
        """Take a delta in; True when the completion has ended (stop the generation)."""
        if self.stopped:
            return True
        self.raw += delta
        cut = self._find_cut(final=False)
        if cut is not None:
            self._cut, self.stopped = cut, True
        return self.stopped

    def _find_cut(self, final: bool) -> int | None:
        marker = SPECIAL_MARKER.search(self.raw)
        text = self.raw if marker is None else self.raw[: marker.start()]
        cut = self._cut_in(text, final or marker is not None)
        if cut is None and marker is not None:
            return marker.start()
        return cut

    def _cut_in(self, text: str, final: bool) -> int | None:
        if not self.rules.multiline:
            newline = text.find("\n")
            return newline if newline != -1 else None
        lines = text.split("\n")
        first_complete = len(lines) > 1 or final
        if first_complete and self._repeats_next_line(self.rules.line_prefix + lines[0]):
            return 0
        # A line is judged once complete, or once its indentation is known (it has
        # something other than whitespace), or when the stream ended.
        position = len(lines[0]) + 1  # start of lines[1] in text
        last_indent = indent_width(self.rules.line_prefix)
        blank_at: int | None = None  # where a run of blank lines started (the newline before it)
        for i, line in enumerate(lines[1:], start=1):
            complete = i < len(lines) - 1 or final
            start = position - 1  # the newline that precedes this line
            position += len(line) + 1
            if not line.strip():
                if complete and blank_at is None:
                    blank_at = start
                continue
            width = indent_width(line)
            if width < self.rules.block_indent:
                return blank_at if blank_at is not None else start
            if blank_at is not None and width < last_indent:
                return blank_at
            if complete and self._repeats_next_line(line):
                return blank_at if blank_at is not None else start
            blank_at = None
            last_indent = width
        return None

    def _repeats_next_line(self, line: str) -> bool:
        return bool(self.rules.next_line) and line.strip() == self.rules.next_line

    def result(self) -> str:
        """The text to insert (call when the stream ended or stopped)."""
        cut = self._cut if self._cut is not None else self._find_cut(final=True)
        text = self.raw if cut is None else self.raw[:cut]
        if self.rules.multiline:
            text = text.rstrip()
        return drop_overlap(text, self.rules.line_prefix, self.rules.line_suffix)


def bracket_excess(text: str) -> int:
    """Closing brackets that have no opening one before them."""
    stack: list[str] = []
    excess = 0
    for ch in text:
        if ch in "([{":
            stack.append(ch)
        elif ch in _PAIRS:
            if stack and stack[-1] == _PAIRS[ch]:
                stack.pop()
            else:
                excess += 1
    return excess


def drop_overlap(text: str, line_prefix: str, line_suffix: str) -> str:
    """`text` without an ending that repeats the start of the rest of the line."""
    rest = line_suffix.rstrip()
    if not rest or not text:
        return text
    last_line_start = text.rfind("\n") + 1
    for k in range(min(len(rest), len(text) - last_line_start), 0, -1):
        overlap = rest[:k]
        if not text.endswith(overlap):
            continue
        if not any(ch in _PAIRS for ch in overlap):
            return text[:-k]
        head = (line_prefix if last_line_start == 0 else "") + text[last_line_start:]
        if bracket_excess(head + rest) > bracket_excess(head[:-k] + rest):
            return text[:-k]
    return text
