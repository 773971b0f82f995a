"""Fill-in-the-middle: rearrange a document so the model learns to complete at a cursor.

A FIM document is cut at two character positions into prefix, middle and suffix
and laid out prefix-suffix-middle (PSM), the order nib's engine prompts with:

    <|fim_prefix|>prefix<|fim_suffix|>suffix<|fim_middle|>middle<|endoftext|>

Cutting at characters rather than tokens teaches the model to finish a token the
cursor splits. Optionally a `<|file_sep|>path\\n` header goes first, as the engine
sends when a client gives the file's path. The pieces are tokenised separately
(with special-token strings in the code treated as text) and joined with the
special ids here.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

PREFIX, SUFFIX, MIDDLE, EOT, FILE_SEP = (
    "<|fim_prefix|>",
    "<|fim_suffix|>",
    "<|fim_middle|>",
    "<|endoftext|>",
    "<|file_sep|>",
)


@dataclass(frozen=True)
class SpecialIds:
    eot: int
    prefix: int
    suffix: int
    middle: int
    file_sep: int


@dataclass(frozen=True)
class Layout:
    """What one document becomes: the text pieces to tokenise, in PSM order when FIM."""

    fim: bool
    pieces: tuple[str, ...]  # plain: (text,); FIM: (prefix, suffix, middle)
    path: str | None = None  # file_sep header, when present


def split_points(n_chars: int, rng: random.Random) -> tuple[int, int]:
    """Two cut positions 0 <= a <= b <= n_chars, uniform over the document's characters."""
    a, b = rng.randint(0, n_chars), rng.randint(0, n_chars)
    return (a, b) if a <= b else (b, a)


def fim_pieces(text: str, a: int, b: int) -> tuple[str, str, str]:
    """(prefix, suffix, middle) for cut points a <= b."""
    if not 0 <= a <= b <= len(text):
        raise ValueError(f"cut points must satisfy 0 <= a <= b <= {len(text)}, got {a}, {b}")
    return text[:a], text[b:], text[a:b]


def layout(text: str, fim: bool, rng: random.Random, path: str | None = None) -> Layout:
    if not fim:
        return Layout(False, (text,), path)
    a, b = split_points(len(text), rng)
    return Layout(True, fim_pieces(text, a, b), path)


def psm_text(lay: Layout) -> str:
    """The document as text with the special-token strings (for reading and tests)."""
    head = f"{FILE_SEP}{lay.path}\n" if lay.path is not None else ""
    if not lay.fim:
        return head + lay.pieces[0] + EOT
    prefix, suffix, middle = lay.pieces
    return f"{head}{PREFIX}{prefix}{SUFFIX}{suffix}{MIDDLE}{middle}{EOT}"


def parts(
    lay: Layout, piece_ids: list[Sequence[int]], path_ids: Sequence[int] | None, ids: SpecialIds
) -> list[Sequence[int]]:
    """The id sequences that, concatenated, make one document (lists or arrays alike)."""
    out: list[Sequence[int]] = []
    if lay.path is not None:
        if path_ids is None:
            raise ValueError("a layout with a path needs the path's token ids")
        out += [[ids.file_sep], path_ids]
    if not lay.fim:
        (body,) = piece_ids
        return [*out, body, [ids.eot]]
    prefix, suffix, middle = piece_ids
    return [*out, [ids.prefix], prefix, [ids.suffix], suffix, [ids.middle], middle, [ids.eot]]


def assemble(
    lay: Layout, piece_ids: list[Sequence[int]], path_ids: Sequence[int] | None, ids: SpecialIds
) -> list[int]:
    """Token ids of one document from its separately tokenised pieces."""
    return [int(i) for part in parts(lay, piece_ids, path_ids, ids) for i in part]
