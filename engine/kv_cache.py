"""A static KV cache: allocated once for the whole context, written in place."""

from __future__ import annotations

import torch
from torch import nn


class KVCache(nn.Module):
    """Keys and values of one layer, [1, kv_heads, max_context, head_dim] each."""

    def __init__(
        self,
        max_context: int,
        kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        super().__init__()
        shape = (1, kv_heads, max_context, head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)

    def update(self, input_pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write k, v [1, kv_heads, T, head_dim] at positions input_pos [T]."""
        self.k.index_copy_(2, input_pos, k)
        self.v.index_copy_(2, input_pos, v)
