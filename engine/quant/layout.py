"""The packed layout the kernels read: the one place where nibbles are arranged.

qweight is int32 [N, K // 8]: row n holds that output's codes along K, eight
codes per word, so one row of a weight tile is contiguous in memory. Inside a
word the nibbles are interleaved across the two 16-bit halves:

    bits  0-3  k+0    bits 16-19  k+1
    bits  4-7  k+2    bits 20-23  k+3
    bits  8-11 k+4    bits 24-27  k+5
    bits 12-15 k+6    bits 28-31  k+7

so that one AND/OR with 0x000F000F / 0x64006400 turns a word into two fp16
values (1024 + c) holding the codes of two *adjacent* inputs: that pair meets
the pair of adjacent fp16 activations in one fp16x2 multiply-add, and shifting
the word right by 4, 8, 12 yields the next pairs (the 1024.0-mantissa trick).
Scales stay as the checkpoint has them, fp16 [K // 128, N]: a tile of
outputs reads one contiguous run of scales per group.
"""

from __future__ import annotations

import torch

PACK = 8  # codes per int32 word
# Where code k % 8 of a word sits, as a bit offset.
NIBBLE_SHIFTS = tuple(4 * (j // 2) + 16 * (j % 2) for j in range(PACK))


def pack(codes: torch.Tensor) -> torch.Tensor:
    """codes uint8 [N, K] (0..15) -> qweight int32 [N, K // 8] in the kernel layout."""
    n, k = codes.shape
    if k % PACK:
        raise ValueError(f"K={k} is not a multiple of {PACK}")
    c = codes.to(torch.int64).view(n, k // PACK, PACK)
    word = torch.zeros(n, k // PACK, dtype=torch.int64, device=codes.device)
    for j, shift in enumerate(NIBBLE_SHIFTS):
        word |= c[:, :, j] << shift
    # Reinterpret the unsigned 32-bit values as int32 (two's complement).
    return torch.where(word >= 2**31, word - 2**32, word).to(torch.int32).contiguous()


def unpack(qweight: torch.Tensor) -> torch.Tensor:
    """qweight int32 [N, K // 8] in the kernel layout -> codes uint8 [N, K]."""
    n, kw = qweight.shape
    word = qweight.to(torch.int64) & 0xFFFFFFFF
    parts = [(word >> shift) & 0xF for shift in NIBBLE_SHIFTS]
    return torch.stack(parts, dim=-1).view(n, kw * PACK).to(torch.uint8)
