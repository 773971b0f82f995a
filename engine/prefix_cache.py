"""Reuse the KV cache across requests that share a token prefix.

An editor sends a new completion on nearly every pause, each prompt almost the
same as the last. The engine's working KV cache still holds the previous
sequence; for a new prompt we reuse its longest common token prefix and
prefill only the rest. A few other sequences (per session, least recently used
first out, within a byte budget) are stashed as copies, so interleaved
sessions keep their prefixes too: switching costs one device copy of the
reused positions instead of a prefill.

Only positions whose keys and values were certainly written count as valid:
the prompt and every generated token that was fed back as input.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from nib.engine.kv_cache import KVCache


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of a and b.

    It runs on the engine thread before every prefill, against every entry: list slices
    compare in C, so halving on them costs a few microseconds where a Python loop over a
    2k-token prompt took ~90 per entry."""
    lo, hi = 0, min(len(a), len(b))  # a[:lo] == b[:lo]; the first difference is before hi
    if a[:hi] == b[:hi]:
        return hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


@dataclass
class _Entry:
    session: str
    tokens: list[int]
    stash: list[tuple[torch.Tensor, torch.Tensor]] | None = None  # None: in the working cache
    used: float = field(default_factory=time.monotonic)

    @property
    def nbytes(self) -> int:
        return sum(k.numel() * k.element_size() * 2 for k, _ in self.stash or ())


class PrefixCache:
    def __init__(
        self,
        caches: list[KVCache],
        max_entries: int = 4,
        budget_bytes: int = 2 << 30,
        min_reuse: int = 4,
    ) -> None:
        self.caches = caches
        self.max_entries = max_entries
        self.budget_bytes = budget_bytes
        self.min_reuse = min_reuse
        self.entries: list[_Entry] = []
        self.resident: _Entry | None = None  # the entry whose KV is in the working cache

    def acquire(self, session: str, prompt: list[int]) -> int:
        """Make the working cache hold the longest reusable prefix of `prompt` and
        return its length (at most len(prompt) - 1: the last prompt token is always
        computed, its logits give the first token)."""
        best, reuse = None, 0
        for entry in self.entries:
            n = min(common_prefix(entry.tokens, prompt), len(prompt) - 1)
            if n > reuse or (n == reuse and n > 0 and entry.session == session):
                best, reuse = entry, n
        if best is None or reuse < self.min_reuse:
            self._stash_resident()
            return 0
        if best is not self.resident:
            self._stash_resident()
            self._restore(best, reuse)
        best.used = time.monotonic()
        return reuse

    def commit(self, session: str, tokens: list[int]) -> None:
        """The working cache now holds valid keys/values for `tokens` (for `session`)."""
        if self.resident is not None and self.resident.stash is None:
            self.entries.remove(self.resident)
        self.entries = [e for e in self.entries if e.session != session]
        self.resident = _Entry(session, list(tokens))
        self.entries.append(self.resident)
        self._evict()

    def invalidate(self) -> None:
        """The working cache's content is unknown (e.g. after an error)."""
        if self.resident is not None and self.resident in self.entries:
            self.entries.remove(self.resident)
        self.resident = None

    def _stash_resident(self) -> None:
        entry = self.resident
        self.resident = None
        if entry is None or not entry.tokens or self.max_entries < 2:
            if entry is not None and entry in self.entries:
                self.entries.remove(entry)
            return
        n = len(entry.tokens)
        entry.stash = [(c.k[:, :, :n].clone(), c.v[:, :, :n].clone()) for c in self.caches]
        self._evict()

    def _restore(self, entry: _Entry, n: int) -> None:
        assert entry.stash is not None
        for cache, (k, v) in zip(self.caches, entry.stash, strict=True):
            cache.k[:, :, :n].copy_(k[:, :, :n])
            cache.v[:, :, :n].copy_(v[:, :, :n])
        # The working cache now holds entry's first n tokens; the stash stays for others.
        self.resident = _Entry(entry.session, entry.tokens[:n])
        self.entries.append(self.resident)

    def _evict(self) -> None:
        stashed = sorted((e for e in self.entries if e.stash is not None), key=lambda e: e.used)
        total = sum(e.nbytes for e in stashed)
        while stashed and (len(self.entries) > self.max_entries or total > self.budget_bytes):
            victim = stashed.pop(0)
            total -= victim.nbytes
            self.entries.remove(victim)
