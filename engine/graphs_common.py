"""Small pieces the GPU step bodies share with tests (no CUDA needed to import)."""

from __future__ import annotations

import torch

from nib.engine.kernels.decode_attention import DecodeAttention
from nib.engine.kv_cache import KVCache
from nib.engine.ops import AttentionFn


def decode_attend_fn(attention: DecodeAttention) -> AttentionFn:
    """Adapt DecodeAttention to the model's attend(q, cache, input_pos, kv_len) seam:
    the filled length comes from input_pos on the device, not from kv_len."""

    def attend(
        q: torch.Tensor, cache: KVCache, input_pos: torch.Tensor, kv_len: int | None
    ) -> torch.Tensor:
        return attention(q, cache.k, cache.v, input_pos)

    return attend
