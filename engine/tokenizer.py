"""Tokenizer (HF `tokenizers`), fill-in-the-middle templates and incremental detokenising."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer

from nib.engine.fim import detect

EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<|eot_id|>", "<|im_end|>", "<eos>")


class Tokenizer:
    def __init__(self, path: str | Path, eos_token_ids: tuple[int, ...] = ()) -> None:
        path = Path(path)
        file = path / "tokenizer.json" if path.is_dir() else path
        self._tok = HFTokenizer.from_file(str(file))
        # The offset-free encode (tokenizers >= 0.21): ~25% less time on the time to first
        # token; tests/unit/test_tokenizer.py checks its ids are encode()'s.
        self._encode_fast = getattr(self._tok, "encode_batch_fast", None)
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        eos = set(eos_token_ids)
        config = file.parent / "tokenizer_config.json"
        if config.is_file():
            eos_text = json.loads(config.read_text()).get("eos_token")
            if isinstance(eos_text, dict):
                eos_text = eos_text.get("content")
            if isinstance(eos_text, str) and self._tok.token_to_id(eos_text) is not None:
                eos.add(self._tok.token_to_id(eos_text))
        if not eos:
            eos = {i for t in EOS_CANDIDATES if (i := self._tok.token_to_id(t)) is not None}
        self.eos_token_ids = frozenset(eos)
        self.fim = detect(self._tok.token_to_id)
        if self.fim is not None:
            # A FIM marker in the output means the model thinks the middle is over (small
            # models often write <|fim_middle|> or <|file_sep|> instead of end-of-text).
            markers = (self.fim.prefix, self.fim.suffix, self.fim.middle, self.fim.file_sep)
            ids = {i for m in markers if m and (i := self._tok.token_to_id(m)) is not None}
            self.eos_token_ids = frozenset({*self.eos_token_ids, *ids})
        if self.fim is not None and self.fim.end is not None:
            end = self._tok.token_to_id(self.fim.end)
            if end is not None:  # the family ends an infill with its own token
                self.eos_token_ids = frozenset({*self.eos_token_ids, end})

    def special_ids(self) -> set[int]:
        """Ids of the tokenizer's special tokens (end-of-text, FIM markers, ...)."""
        return {i for i, t in self._tok.get_added_tokens_decoder().items() if t.special}

    def encode(self, text: str) -> list[int]:
        # One text runs in the calling thread, not on the tokenizer's thread pool.
        if self._encode_fast is not None:
            ids: list[int] = self._encode_fast([text], add_special_tokens=False)[0].ids
        else:
            ids = self._tok.encode(text, add_special_tokens=False).ids
        return ids

    def decode(self, ids: list[int]) -> str:
        text: str = self._tok.decode(ids, skip_special_tokens=False)
        return text

    def token_id(self, token: str) -> int:
        i = self._tok.token_to_id(token)
        if i is None:
            raise KeyError(token)
        return int(i)

    def encode_infill(self, prefix: str, suffix: str, path: str = "") -> list[int]:
        """Prompt ids for generating what goes between prefix and suffix (see fim.py)."""
        if self.fim is None:
            raise ValueError("this model's tokenizer has no fill-in-the-middle tokens")
        return self.fim.build(self.encode, self._tok.token_to_id, prefix, suffix, path)


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas.

    Decodes a short window of recent tokens twice (with and without the newest)
    and emits the difference, so leading-space rules and multi-token UTF-8
    characters come out right; text ending in U+FFFD waits for the next token.
    """

    def __init__(self, tokenizer: Tokenizer, context_ids: list[int] | None = None) -> None:
        self._tok = tokenizer
        self._ids: list[int] = list(context_ids or [])[-4:]
        self._prefix_offset = 0
        self._read_offset = len(self._ids)

    def push(self, token_id: int) -> str:
        self._ids.append(token_id)
        prefix_text = self._tok.decode(self._ids[self._prefix_offset : self._read_offset])
        new_text = self._tok.decode(self._ids[self._prefix_offset :])
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            delta = new_text[len(prefix_text) :]
            self._prefix_offset = self._read_offset
            self._read_offset = len(self._ids)
            return delta
        return ""


class StopMatcher:
    """Finds the stop string that starts first in the generated text, and holds
    back text that could still be the start of one.

    feed() returns (text safe to emit, matched stop or None); after a match the
    text before the stop has been returned and the rest is dropped. A stop that
    has completed is only reported once no other stop could still complete at
    an earlier position; at the end of generation flush() settles that.
    """

    def __init__(self, stops: tuple[str, ...]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._pending = ""

    def feed(self, text: str) -> tuple[str, str | None]:
        if not self._stops:
            return text, None
        return self._scan(self._pending + text, final=False)

    def flush(self) -> tuple[str, str | None]:
        """At the end of generation: the held-back text, cut at a stop if one is in it."""
        return self._scan(self._pending, final=True)

    def _scan(self, buf: str, final: bool) -> tuple[str, str | None]:
        hits = [(i, -len(s), s) for s in self._stops if (i := buf.find(s)) >= 0]
        first = min(hits) if hits else None
        end = first[0] if first else len(buf)
        # The earliest position before `end` where a stop could still begin.
        partial = None
        if not final:
            for j in range(max(0, len(buf) - max(map(len, self._stops)) + 1), end):
                tail = buf[j:]
                if any(len(s) > len(tail) and s.startswith(tail) for s in self._stops):
                    partial = j
                    break
        if partial is not None:
            self._pending = buf[partial:]
            return buf[:partial], None
        self._pending = ""
        if first is not None:
            return buf[: first[0]], first[2]
        return buf, None
