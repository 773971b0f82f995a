"""Tokenizer (HF `tokenizers`), fill-in-the-middle templates and incremental detokenising."""

from __future__ import annotations

import bisect
import functools
import itertools
import json
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
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

    @functools.cached_property
    def _byte_level(self) -> tuple[list[int], tuple[bytes, ...]]:
        return _byte_lengths(self._tok)

    def token_bytes(self) -> list[int] | None:
        """UTF-8 bytes each id stands for, where ids are byte-level BPE pieces (their
        concatenation is the text's bytes, nothing added or normalised); else None."""
        return self._byte_level[0] or None

    @property
    def added_texts(self) -> tuple[bytes, ...]:
        """The text of the added tokens, where token_bytes() is not None."""
        return self._byte_level[1]

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

    def encode_infill(
        self,
        prefix: str,
        suffix: str,
        path: str = "",
        encode: Callable[[str], list[int]] | None = None,
    ) -> list[int]:
        """Prompt ids for generating what goes between prefix and suffix (see fim.py);
        `encode` tokenises each part (default: encode())."""
        if self.fim is None:
            raise ValueError("this model's tokenizer has no fill-in-the-middle tokens")
        return self.fim.build(encode or self.encode, self._tok.token_to_id, prefix, suffix, path)


# Where a new pre-token begins in every byte-level regex these tokenizers use (GPT-2's,
# and the Qwen2 / Llama-3 pattern split before a non-regex ByteLevel step), whatever
# the text before: at a line's first visible ASCII character when the line has no
# indentation, and at the last space of its indentation when that is spaces only (the
# space joins the word after it, the newline and the other spaces end a whitespace
# run, and nothing in the patterns looks back). So the ids of a text are those of its
# part before such a place followed by those of the rest on its own.
def _line_start_splits(config: dict[str, object]) -> bool:
    """Whether the tokenizer's config is one for which the rule above holds."""
    if config.get("normalizer") is not None:
        return False
    pre = config.get("pre_tokenizer")
    if not isinstance(pre, dict):
        return False
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    if not isinstance(steps, list) or not steps:
        return False
    *splits, last = steps
    if last.get("type") != "ByteLevel" or last.get("add_prefix_space"):
        return False
    if not splits:
        return bool(last.get("use_regex", True))  # GPT-2's regex inside ByteLevel
    return (
        not last.get("use_regex", True)
        and len(splits) == 1
        and splits[0].get("type") == "Split"
        and splits[0].get("behavior") == "Isolated"
    )


def _byte_lengths(tok: HFTokenizer) -> tuple[list[int], tuple[bytes, ...]]:
    """Bytes per id for a byte-level BPE tokenizer that splits at line starts, and the
    text of its added tokens; ([], ()) if it is not one."""
    config = json.loads(tok.to_str())
    if config.get("model", {}).get("type") != "BPE" or not _line_start_splits(config):
        return [], ()
    added = {t["id"]: t["content"] for t in config.get("added_tokens", [])}
    if any("\n" in text for text in added.values()):
        return [], ()  # an added token could span the line starts the splits rely on
    lengths = [0] * tok.get_vocab_size(with_added_tokens=True)
    for piece, i in tok.get_vocab(with_added_tokens=True).items():
        # A byte-level piece is one character per byte; added tokens are plain text.
        lengths[i] = len(added[i].encode()) if i in added else len(piece)
    return lengths, tuple(sorted({t.encode() for t in added.values() if t}))


@dataclass
class _Tokenised:
    data: bytes  # the text, UTF-8
    ids: list[int]
    ends: list[int]  # byte offset where each id's piece ends


class SessionTokens:
    """Token ids of prompts that share most of their text with an earlier prompt of the
    same editing session, without tokenising that shared part again.

    An editor sends the file up to the cursor again and again, a few characters longer
    or edited a few lines up. For a tokenizer where a new pre-token begins at a line's
    first visible character, or at the last space of its indentation, whatever came
    before (see _line_start_splits), the ids are the earlier prompt's ids up to the
    last such place before the first changed byte, then the rest tokenised on its
    own: the same ids as tokenising the whole text
    (tests/unit/test_session_tokens.py holds it to that on random edits). Other
    tokenizers, texts without a session, and texts sharing less than `min_shared`
    bytes are tokenised whole. Keeps the last `per_session` texts of the last
    `sessions` sessions. Thread-safe."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        sessions: int = 64,
        per_session: int = 3,
        min_shared: int = 256,
        max_bytes: int = 64 << 20,
    ) -> None:
        self.tokenizer = tokenizer
        self.sessions, self.per_session, self.min_shared = sessions, per_session, min_shared
        self.max_bytes = max_bytes
        self._seen: OrderedDict[str, list[_Tokenised]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        # Since start: prompt bytes handed to the tokenizer, bytes an earlier prompt of the
        # session spared it, and prompts tokenised by reuse (metrics, tests).
        self.tokenised_bytes = 0
        self.reused_bytes = 0
        self.splices = 0

    def encode(self, text: str, session: str = "") -> list[int]:
        lengths = self.tokenizer.token_bytes() if session else None
        if lengths is None:
            self.tokenised_bytes += len(text.encode())
            return self.tokenizer.encode(text)
        data = text.encode()
        earlier, start, kept = self._reuse(data, session)
        done = None
        if earlier is not None and start == len(data):
            done = earlier
            self.reused_bytes += len(data)
        elif earlier is not None and start is not None:
            rest = self.tokenizer.encode(data[start:].decode())
            ends = earlier.ends[:kept]
            ends += [start + e for e in itertools.accumulate(lengths[i] for i in rest)]
            if ends[-1] == len(data):
                done = _Tokenised(data, earlier.ids[:kept] + rest, ends)
                self.tokenised_bytes += len(data) - start
                self.reused_bytes += start
                self.splices += 1
        if done is None:
            ids = self.tokenizer.encode(text)
            self.tokenised_bytes += len(data)
            if len(data) < self.min_shared:
                return ids  # too short to be worth keeping
            done = _Tokenised(data, ids, list(itertools.accumulate(lengths[i] for i in ids)))
            if done.ends and done.ends[-1] != len(data):  # not byte-level after all: no reuse
                return ids
        self._remember(session, done, earlier)
        return list(done.ids)

    def fresh_bytes(self, text: str, session: str = "") -> int:
        """Bytes of `text` that encode(text, session) would hand to the tokenizer now."""
        data = text.encode()
        _, start, _ = self._reuse(data, session)
        return len(data) - (start or 0)

    def _reuse(self, data: bytes, session: str) -> tuple[_Tokenised | None, int | None, int]:
        """(the session's text to build on, the byte to tokenise from, how many of its
        ids to keep); (None, None, 0) to tokenise the whole text."""
        if not session or self.tokenizer.token_bytes() is None:
            return None, None, 0
        with self._lock:
            entries = list(self._seen.get(session, ()))
        earlier, shared = None, 0
        for entry in entries:
            n = _shared_prefix(entry.data, data)
            if n > shared:
                earlier, shared = entry, n
        if earlier is None or shared < self.min_shared:
            return None, None, 0
        if shared == len(data) == len(earlier.data):
            return earlier, len(data), len(earlier.ids)
        # Added tokens are cut out of the text before the regex runs: one that begins in
        # the indentation or at the line's first character (in either text) ends the
        # segment before it there, which changes how the whitespace before it splits.
        added = self.tokenizer.added_texts
        old = earlier.data
        start = _last_split(
            data,
            shared,
            lambda i, j: not any(
                text.startswith(t, k) for text in (data, old) for t in added
                for k in range(i, j + 1)
            ),
        )  # fmt: skip
        if start is None:
            return None, None, 0
        kept = bisect.bisect_left(earlier.ends, start)
        if kept >= len(earlier.ends) or earlier.ends[kept] != start:
            return None, None, 0  # not a token boundary: not a tokenizer the rule is for
        return earlier, start, kept + 1

    def _remember(self, session: str, done: _Tokenised, replaced: _Tokenised | None) -> None:
        """Keep `done` as the session's newest text, in place of the one it came from."""
        with self._lock:
            before = self._seen.pop(session, [])
            entries = [*(e for e in before if e is not replaced), done]
            entries = entries[-self.per_session :]
            self._seen[session] = entries
            self._bytes += sum(_size(e) for e in entries) - sum(_size(e) for e in before)
            while len(self._seen) > 1 and (
                len(self._seen) > self.sessions or self._bytes > self.max_bytes
            ):
                _, dropped = self._seen.popitem(last=False)
                self._bytes -= sum(_size(e) for e in dropped)


def _size(entry: _Tokenised) -> int:
    """Bytes an entry holds, roughly: its text and two list slots per id."""
    return len(entry.data) + 16 * len(entry.ids)


def _last_split(
    data: bytes, shared: int, ok: Callable[[int, int], bool], lines: int = 4096
) -> int | None:
    """The last place in data[:shared] where a pre-token begins whatever came before
    (see above), deciding on bytes inside data[:shared] only, and where ok(place, the
    line's first visible character) holds; None if there is none near."""
    cut = data.rfind(b"\n", 0, shared)
    for _ in range(lines):
        if cut < 0:
            return None
        first = cut + 1
        while first < shared and data[first] == 0x20:
            first += 1
        if first < shared and 0x21 <= data[first] <= 0x7E:  # visible ASCII
            place = first if first == cut + 1 else first - 1
            if ok(place, first):
                return place
        cut = data.rfind(b"\n", 0, cut)
    return None


def _shared_prefix(a: bytes, b: bytes) -> int:
    """Length of the longest common prefix of a and b (binary search over C compares)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


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
