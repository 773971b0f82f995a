"""Small pieces the GPU step bodies share with tests (no CUDA needed to import)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from nib.engine.kernels.decode_attention import DecodeAttention
from nib.engine.kv_cache import KVCache
from nib.engine.ops import AttentionFn

if TYPE_CHECKING:
    from nib.engine.cuda.attention import FusedDecodeAttention


def decode_attend_fn(
    attention: DecodeAttention, fused: FusedDecodeAttention | None = None
) -> AttentionFn:
    """Adapt DecodeAttention to the model's attend(q, cache, input_pos, kv_len) seam:
    the filled length comes from input_pos on the device, not from kv_len.

    With `fused` (the CUDA kernel that also does RoPE and the KV-cache write), the
    function carries `rope_attend(qkv, input_pos, cos, sin, cache)`, which
    Attention.heads calls instead of rope_cache + attend for one token; more tokens
    (or no fused kernel) keep the Triton pair."""

    def attend(
        q: torch.Tensor, cache: KVCache, input_pos: torch.Tensor, kv_len: int | None
    ) -> torch.Tensor:
        return attention(q, cache.k, cache.v, input_pos)

    if fused is not None:

        def rope_attend(
            qkv: torch.Tensor,
            input_pos: torch.Tensor,
            cos: torch.Tensor,
            sin: torch.Tensor,
            cache: KVCache,
        ) -> torch.Tensor:
            return fused(qkv.contiguous(), input_pos, cos, sin, cache.k, cache.v)

        attend.rope_attend = rope_attend  # type: ignore[attr-defined]
    return attend
