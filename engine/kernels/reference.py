"""PyTorch references of the Triton kernels (no triton import: the CPU path uses these)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def silu_mul_ref(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def rope_cache_ref(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    cos_table: torch.Tensor,
    sin_table: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
) -> torch.Tensor:
    """qkv [1, T, (H + 2 KVH) * D] -> q [1, H, T, D]; writes k, v into caches [1, KVH, S, D]."""
    d = k_cache.shape[-1]
    t = qkv.shape[1]
    q, k, v = qkv.split([num_heads * d, num_kv_heads * d, num_kv_heads * d], dim=-1)
    q = q.view(1, t, num_heads, d).transpose(1, 2)
    k = k.view(1, t, num_kv_heads, d).transpose(1, 2)
    v = v.view(1, t, num_kv_heads, d).transpose(1, 2)
    cos, sin = cos_table[positions], sin_table[positions]

    def rotate(x: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin

    k_cache.index_copy_(2, positions, rotate(k))
    v_cache.index_copy_(2, positions, v)
    return rotate(q)


def decode_attention_ref(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, length: int
) -> torch.Tensor:
    """q [1, H, 1, D]; caches [1, KVH, S, D] -> [1, H, 1, D] attending to [0, length)."""
    k = k_cache[:, :, :length].float()
    v = v_cache[:, :, :length].float()
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = (q.float() @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    return (scores.softmax(-1) @ v).to(q.dtype)


def attention_ref(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, positions: torch.Tensor
) -> torch.Tensor:
    """q [1, H, T, D]; query t attends to cache positions [0, positions[t]] -> [1, H, T, D]."""
    rows = [
        decode_attention_ref(q[:, :, t : t + 1], k_cache, v_cache, int(positions[t]) + 1)
        for t in range(q.shape[2])
    ]
    return torch.cat(rows, dim=2)


def sample_scores_ref(
    logits: torch.Tensor, temperature: float, top_k: int, top_p: float, noise: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The exponential race DeviceSampler runs, as (token ids by rank, score per rank):
    the sampled token is the one with the highest score. noise[r] belongs to the token
    of rank r (by probability, descending); tokens outside top-k / top-p score -1."""
    probs = (logits.double() / temperature).softmax(dim=-1)
    order = torch.argsort(probs, descending=True, stable=True)
    ranked = probs[order]
    mass_above = torch.cumsum(ranked, dim=0) - ranked
    rank = torch.arange(ranked.numel(), device=logits.device)
    keep = torch.ones_like(ranked, dtype=torch.bool)
    if top_k > 0:
        keep &= rank < top_k
    if top_p < 1.0:
        keep &= mass_above < top_p
    scores = torch.where(keep, ranked / noise.double(), torch.full_like(ranked, -1.0))
    return order, scores
