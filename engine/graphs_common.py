"""Small pieces the GPU step bodies share with tests (no CUDA needed to import)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import nn

from nib.engine.kernels.decode_attention import DecodeAttention
from nib.engine.kv_cache import KVCache
from nib.engine.ops import AttentionFn
from nib.engine.quant.linear import Int4Linear

if TYPE_CHECKING:
    from nib.engine.cuda.attention import FusedDecodeAttention
    from nib.engine.cuda.attention_oproj import FusedAttentionOproj


def decode_attend_fn(
    attention: DecodeAttention,
    fused: FusedDecodeAttention | None = None,
    oproj: Callable[[], FusedAttentionOproj | None] | None = None,
) -> AttentionFn:
    """Adapt DecodeAttention to the model's attend(q, cache, input_pos, kv_len) seam:
    the filled length comes from input_pos on the device, not from kv_len.

    With `fused` (the CUDA kernel that also does RoPE and the KV-cache write), the
    function carries `rope_attend(qkv, input_pos, cos, sin, cache)`, which
    Attention.heads calls instead of rope_cache + attend for one token; more tokens
    (or no fused kernel) keep the Triton pair. With `oproj` (asked at each call: the
    kernel with the INT4 o_proj fused behind the attention, or None while it is not
    to be used), it also carries `rope_attend_out(qkv, input_pos, cos, sin, cache, wo,
    residual) -> bool`, which Attention.attend_out calls first: True where it did
    both (residual += wo(attention) in place), False where wo cannot run in it."""

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
    if oproj is not None:

        def rope_attend_out(
            qkv: torch.Tensor,
            input_pos: torch.Tensor,
            cos: torch.Tensor,
            sin: torch.Tensor,
            cache: KVCache,
            wo: nn.Module,
            residual: torch.Tensor,
        ) -> bool:
            kernel = oproj()
            packed = wo.cuda if isinstance(wo, Int4Linear) and not wo.use_reference else None
            if kernel is None or kernel.supports(packed):
                return False
            kernel(qkv.contiguous(), input_pos, cos, sin, cache.k, cache.v, packed, residual)
            return True

        attend.rope_attend_out = rope_attend_out  # type: ignore[attr-defined]
    return attend
