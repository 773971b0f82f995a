"""The glue between the matrix products, behind one seam.

model.py calls these operations; `TorchOps` is the plain PyTorch reference
(and the CPU path), `TritonOps` runs the fused Triton kernels on the GPU. Both
compute the same function with the same rounding points, except the batch-1
GEMV with the norm folded in, which scales the product by 1/rms at the end
instead of rounding the normalised input to 16 bits first (kernels/gemv.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:
    from nib.engine.kv_cache import KVCache

# attend(q [1,H,T,D], cache, input_pos [T], kv_len) -> [1,H,T,D]
AttentionFn = Callable[[torch.Tensor, "KVCache", torch.Tensor, int | None], torch.Tensor]


def eager_attention(
    q: torch.Tensor, cache: KVCache, input_pos: torch.Tensor, kv_len: int | None
) -> torch.Tensor:
    """Causal attention over the first kv_len cache positions (the whole cache if None)."""
    n = cache.k.shape[2] if kv_len is None else kv_len
    k, v = cache.k[:, :, :n], cache.v[:, :, :n]
    mask = torch.arange(n, device=q.device)[None, :] <= input_pos[:, None]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


def fresh_prefill_attention(
    q: torch.Tensor, cache: KVCache, input_pos: torch.Tensor, kv_len: int | None
) -> torch.Tensor:
    """Causal attention for a prompt written at positions [0, T): reads only cache[:T]."""
    t = q.shape[2]
    k, v = cache.k[:, :, :t], cache.v[:, :, :t]
    group = q.shape[1] // k.shape[1]
    if group > 1:  # the flash kernel wants equal head counts
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class TorchOps:
    name = "torch"

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
        return weight * h.to(x.dtype)

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> torch.Tensor:
        """residual += x in place; returns the normalised residual."""
        residual.add_(x)
        return self.rms_norm(residual, weight, eps)

    def rope_cache(
        self,
        qkv: torch.Tensor,
        positions: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: KVCache,
        num_heads: int,
        num_kv_heads: int,
    ) -> torch.Tensor:
        from nib.engine.kernels.reference import rope_cache_ref

        return rope_cache_ref(qkv, positions, cos, sin, cache.k, cache.v, num_heads, num_kv_heads)

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up

    def norm_linear(
        self,
        residual: torch.Tensor,
        pending: torch.Tensor | None,
        weight: torch.Tensor,
        eps: float,
        linear: nn.Module,
    ) -> torch.Tensor:
        """linear(rms_norm(residual) * weight), after residual += pending (in place)."""
        if pending is None:
            return linear(self.rms_norm(residual, weight, eps))  # type: ignore[no-any-return]
        return linear(self.add_rms_norm(pending, residual, weight, eps))  # type: ignore[no-any-return]

    def norm_glu(
        self,
        residual: torch.Tensor,
        pending: torch.Tensor | None,
        weight: torch.Tensor,
        eps: float,
        linear: nn.Module,
    ) -> torch.Tensor:
        """silu(gate) * up of the fused gate_up projection of the normalised residual."""
        return self.silu_mul(self.norm_linear(residual, pending, weight, eps, linear))

    def linear_residual(
        self, x: torch.Tensor, linear: nn.Module, residual: torch.Tensor
    ) -> torch.Tensor | None:
        """linear(x), still to be added to the residual stream: returned as `pending` for
        the next norm to add, or added here in place (then None)."""
        return linear(x)  # type: ignore[no-any-return]

    attend: AttentionFn = staticmethod(eager_attention)  # type: ignore[assignment]


class TritonOps(TorchOps):
    name = "triton"

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        from nib.engine.kernels.norm import rms_norm

        return rms_norm(x, weight, eps)

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> torch.Tensor:
        from nib.engine.kernels.norm import add_rms_norm

        return add_rms_norm(x, residual, weight, eps)

    def rope_cache(
        self,
        qkv: torch.Tensor,
        positions: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: KVCache,
        num_heads: int,
        num_kv_heads: int,
    ) -> torch.Tensor:
        from nib.engine.kernels.rope_cache import rope_cache

        return rope_cache(qkv, positions, cos, sin, cache.k, cache.v, num_heads, num_kv_heads)

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        from nib.engine.kernels.activation import silu_mul

        return silu_mul(gate_up)

    # The batch-1 path: when the linear (a GemvLinear, or an Int4Linear on the GPU) has a
    # fused config for this position, one kernel does the glue and the product
    # (kernels/gemv.py, quant/fused_gemv.py): the module's norm_forward / residual_forward.

    def norm_linear(
        self,
        residual: torch.Tensor,
        pending: torch.Tensor | None,
        weight: torch.Tensor,
        eps: float,
        linear: nn.Module,
    ) -> torch.Tensor:
        fused = _norm_gemv(residual, pending, weight, eps, linear, "norm")
        return (
            super().norm_linear(residual, pending, weight, eps, linear) if fused is None else fused
        )

    def norm_glu(
        self,
        residual: torch.Tensor,
        pending: torch.Tensor | None,
        weight: torch.Tensor,
        eps: float,
        linear: nn.Module,
    ) -> torch.Tensor:
        fused = _norm_gemv(residual, pending, weight, eps, linear, "norm_glu")
        return super().norm_glu(residual, pending, weight, eps, linear) if fused is None else fused

    def linear_residual(
        self, x: torch.Tensor, linear: nn.Module, residual: torch.Tensor
    ) -> torch.Tensor | None:
        cfg = _fused_config(linear, x, "residual")
        if cfg is None or residual.numel() != linear.out_features:  # type: ignore[operator]
            return super().linear_residual(x, linear, residual)
        linear.residual_forward(x, residual)  # type: ignore[operator]
        return None


def _norm_gemv(
    residual: torch.Tensor,
    pending: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    linear: nn.Module,
    fusion: str,
) -> torch.Tensor | None:
    """The fused norm (+ SiLU·mul) GEMV's output, or None where it does not apply (more
    than one row, a pending residual add, or a linear without that fusion)."""
    cfg = _fused_config(linear, residual, fusion) if pending is None else None
    if cfg is None:
        return None
    out: torch.Tensor = linear.norm_forward(residual, weight, eps, fusion == "norm_glu")  # type: ignore[operator]
    return out


def _fused_config(linear: nn.Module, x: torch.Tensor, fusion: str) -> object | None:
    """The fused kernel's tile config if `linear` fuses `fusion` and x is one row."""
    if getattr(linear, "fusion", "") != fusion or x.numel() != linear.in_features:  # type: ignore[operator]
        return None
    if getattr(linear, "use_reference", False) or not x.is_cuda:
        return None
    return getattr(linear, "fused", None)
