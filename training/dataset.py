"""Pre-tokenised training data: one flat token stream, sampled in chunks on the device.

The whole corpus is tokenised once, before training, into a uint16 array of
documents separated by <|endoftext|>; it is copied to the GPU once and every
batch is an index gather there, so the GPU never waits for data.

FIM variants: the corpus is laid out `variants` times. Each document draws one
uniform number u; in variant v it is FIM when (u + v / variants) mod 1 < rate, so
with two variants and rate 0.5 every document appears once whole and once
rearranged, each time with fresh cut points and a fresh shuffle.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from tokenizers import Tokenizer

from training.bpe import special_ids
from training.fim import Layout, layout, parts


@dataclass(frozen=True)
class FimConfig:
    rate: float = 0.5  # share of documents rearranged prefix-suffix-middle, per variant
    variants: int = 2  # how many differently laid-out copies of the corpus to train on
    path_rate: float = 0.5  # share of documents that start with <|file_sep|>path\n


@dataclass(frozen=True)
class StreamStats:
    documents: int
    fim_documents: int
    tokens: int
    text_bytes: int


def _encode(tok: Tokenizer, texts: list[str], batch_chars: int = 4_000_000) -> list[np.ndarray]:
    """Token ids of each text, with special-token strings inside the code taken as text.

    Encoded in batches of a few MB: an Encoding object costs tens of bytes per token,
    and holding them for the whole corpus at once made encoding several times slower.
    """
    out: list[np.ndarray] = []
    tok.encode_special_tokens = True
    try:
        start = 0
        while start < len(texts):
            end, size = start, 0
            while end < len(texts) and (size < batch_chars or end == start):
                size += len(texts[end])
                end += 1
            out += [
                np.asarray(e.ids, dtype=np.uint16) for e in tok.encode_batch_fast(texts[start:end])
            ]
            start = end
    finally:
        tok.encode_special_tokens = False
    return out


def build_stream(
    tok: Tokenizer,
    docs: Sequence[tuple[str, str]],
    fim: FimConfig | None,
    seed: int,
) -> tuple[np.ndarray, StreamStats]:
    """Token stream of (path, text) documents; fim=None lays each out once, whole, unshuffled."""
    if tok.get_vocab_size(with_added_tokens=True) > 65536:
        raise ValueError("a uint16 token stream needs a vocabulary of at most 65536")
    ids = special_ids(tok)
    variants = 1 if fim is None else fim.variants
    u = [random.Random(f"{seed}:u:{i}").random() for i in range(len(docs))]
    layouts: list[Layout] = []
    for v in range(variants):
        rng = random.Random(f"{seed}:variant:{v}")
        order = list(range(len(docs)))
        if fim is not None:
            rng.shuffle(order)
        for i in order:
            path, text = docs[i]
            if fim is None:
                layouts.append(layout(text, False, rng))
                continue
            is_fim = (u[i] + v / variants) % 1.0 < fim.rate
            with_path = rng.random() < fim.path_rate
            layouts.append(layout(text, is_fim, rng, path if with_path else None))
    texts: list[str] = []
    for lay in layouts:
        texts.extend(lay.pieces)
        if lay.path is not None:
            texts.append(lay.path + "\n")
    encoded = _encode(tok, texts)
    chunks: list[Sequence[int]] = []
    pos = 0
    for lay in layouts:
        n = len(lay.pieces)
        pieces: list[Sequence[int]] = list(encoded[pos : pos + n])
        pos += n
        path_ids = None
        if lay.path is not None:
            path_ids, pos = encoded[pos], pos + 1
        chunks.extend(parts(lay, pieces, path_ids, ids))
    stream = np.concatenate([np.asarray(c, dtype=np.uint16) for c in chunks])
    stats = StreamStats(
        documents=len(layouts),
        fim_documents=sum(lay.fim for lay in layouts),
        tokens=int(stream.size),
        text_bytes=sum(len(t.encode("utf-8")) for t in texts),
    )
    return stream, stats


class ChunkSampler:
    """Batches of (input, target) windows from a token stream that lives on the device.

    Each epoch cuts the stream into windows of seq_len + 1 tokens at a random offset
    and visits them in a random order, so every token is seen once per epoch.
    """

    def __init__(
        self, stream: np.ndarray, seq_len: int, batch_size: int, device: torch.device, seed: int
    ) -> None:
        if stream.size < (seq_len + 1) * batch_size + seq_len:
            raise ValueError(
                f"the token stream ({stream.size} tokens) is shorter than one batch of "
                f"{batch_size} x {seq_len + 1} tokens"
            )
        self.tokens = torch.from_numpy(stream.astype(np.int32)).to(device)
        self.seq_len, self.batch_size, self.device = seq_len, batch_size, device
        self.gen = torch.Generator(device="cpu").manual_seed(seed)
        self.epoch = -1
        self._order = torch.empty(0, dtype=torch.long)
        self._next = 0
        self._offset = 0
        self._arange = torch.arange(seq_len + 1, device=device)

    def _new_epoch(self) -> None:
        self.epoch += 1
        self._offset = int(torch.randint(0, self.seq_len, (1,), generator=self.gen))
        n = (self.tokens.numel() - self._offset - 1) // self.seq_len
        # The permutation lives on the device: a step then needs no host-to-device copy.
        self._order = torch.randperm(n, generator=self.gen).to(self.device)
        self._next = 0

    def first_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The stream's first windows, without moving the sampler (for timing a step)."""
        starts = torch.arange(self.batch_size, device=self.device) * self.seq_len
        window = self.tokens[starts[:, None] + self._arange].long()
        return window[:, :-1], window[:, 1:]

    @property
    def epochs_done(self) -> float:
        return max(0, self.epoch) + self._next / max(1, self._order.numel())

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._next + self.batch_size > self._order.numel():
            self._new_epoch()
        chunk = self._order[self._next : self._next + self.batch_size]
        self._next += self.batch_size
        starts = chunk * self.seq_len + self._offset
        window = self.tokens[starts[:, None] + self._arange].long()
        return window[:, :-1], window[:, 1:]
