"""Fill-in-the-middle templates, one per model family, detected from the tokenizer.

Each family marks the hole with its own special tokens. All four supported
here use prefix-suffix-middle order: the model reads the code before the
cursor, then the code after it, then writes the middle until its end token.

| family | tokens | file path |
|---|---|---|
| qwen2.5-coder (also nib's shipped model) | <|fim_prefix|> <|fim_suffix|> <|fim_middle|> | <|file_sep|>path |
| starcoder2 | <fim_prefix> <fim_suffix> <fim_middle> | <file_sep>path |
| deepseek-coder | <｜fim▁begin｜> <｜fim▁hole｜> <｜fim▁end｜> | — |
| codellama | ▁<PRE> ▁<SUF> ▁<MID> (ends with ▁<EOT>) | — |
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class FimTemplate:
    family: str
    prefix: str
    suffix: str
    middle: str
    file_sep: str | None = None  # introduces the file's path, where the family has one
    end: str | None = None  # an end-of-infill token besides the tokenizer's end-of-text

    def build(
        self,
        encode: Callable[[str], list[int]],
        token_id: Callable[[str], int | None],
        prefix: str,
        suffix: str,
        path: str = "",
    ) -> list[int]:
        """Prompt ids for writing what goes between prefix and suffix."""

        def special(token: str) -> int:
            i = token_id(token)
            if i is None:
                raise KeyError(f"{self.family} FIM token {token!r} is not in the vocabulary")
            return i

        ids: list[int] = []
        if path and self.file_sep is not None and token_id(self.file_sep) is not None:
            ids += [special(self.file_sep), *encode(path + "\n")]
        ids += [special(self.prefix), *encode(prefix)]
        ids += [special(self.suffix), *encode(suffix)]
        ids.append(special(self.middle))
        return ids


# Detection order: the first family whose prefix/suffix/middle tokens all exist wins.
TEMPLATES = (
    FimTemplate(
        "qwen2.5-coder", "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|file_sep|>"
    ),
    FimTemplate("starcoder2", "<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<file_sep>"),
    FimTemplate("deepseek-coder", "<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),
    FimTemplate("codellama", "▁<PRE>", "▁<SUF>", "▁<MID>", end="▁<EOT>"),
)


def detect(token_id: Callable[[str], int | None]) -> FimTemplate | None:
    """The template whose special tokens the vocabulary holds, or None."""
    for template in TEMPLATES:
        if all(
            token_id(t) is not None for t in (template.prefix, template.suffix, template.middle)
        ):
            return template
    return None
