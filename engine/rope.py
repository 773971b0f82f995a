"""Rotary position embeddings, computed the way Hugging Face does (rotate-half layout)."""

from __future__ import annotations

import math

import torch

from nib.engine.config import ModelConfig


def inv_frequencies(cfg: ModelConfig) -> torch.Tensor:
    """Inverse frequencies [head_dim/2] in fp32, including llama3/linear scaling."""
    dim = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    s = cfg.rope_scaling
    if s.rope_type == "linear":
        inv = inv / s.factor
    elif s.rope_type == "llama3":
        low_wavelen = s.original_max_position_embeddings / s.low_freq_factor
        high_wavelen = s.original_max_position_embeddings / s.high_freq_factor
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > low_wavelen, inv / s.factor, inv)
        smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
            s.high_freq_factor - s.low_freq_factor
        )
        smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        inv = torch.where(medium, smoothed, scaled)
    return inv


def cos_sin_table(cfg: ModelConfig, max_positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin, each [max_positions, head_dim] in fp32 (halves repeated, HF layout)."""
    inv = inv_frequencies(cfg)
    freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, H, T, D]; cos/sin [T, D] already in x's dtype."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
