"""The decoder: one compact Llama-family transformer (Llama 2/3, Mistral, Qwen2).

Linear layers are plain `nn.Linear` so quantisation can swap them for its own
modules; q/k/v and gate/up are fused into one matrix each at load time.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from nib.engine.config import ModelConfig
from nib.engine.kv_cache import KVCache
from nib.engine.rope import apply_rope, cos_sin_table

# attend(q [1,H,T,D], cache, input_pos [T], kv_len) -> [1,H,T,D]
AttentionFn = Callable[[torch.Tensor, KVCache, torch.Tensor, int | None], torch.Tensor]


def eager_attention(
    q: torch.Tensor, cache: KVCache, input_pos: torch.Tensor, kv_len: int | None
) -> torch.Tensor:
    """Causal attention over the filled part of the cache (kv_len positions)."""
    n = cache.k.shape[2] if kv_len is None else kv_len
    k, v = cache.k[:, :, :n], cache.v[:, :, :n]
    mask = torch.arange(n, device=q.device)[None, :] <= input_pos[:, None]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32, as the reference implementation does.
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.wqkv = nn.Linear(cfg.hidden_size, cfg.q_size + 2 * cfg.kv_size, bias=cfg.qkv_bias)
        self.wo = nn.Linear(cfg.q_size, cfg.hidden_size, bias=cfg.o_bias)
        self.cache: KVCache | None = None

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        input_pos: torch.Tensor,
        kv_len: int | None,
        attend: AttentionFn,
    ) -> torch.Tensor:
        cfg = self.cfg
        bsz, t, _ = x.shape
        q, k, v = self.wqkv(x).split([cfg.q_size, cfg.kv_size, cfg.kv_size], dim=-1)
        q = q.view(bsz, t, cfg.num_heads, cfg.head_dim).transpose(1, 2)
        k = k.view(bsz, t, cfg.num_kv_heads, cfg.head_dim).transpose(1, 2)
        v = v.view(bsz, t, cfg.num_kv_heads, cfg.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        assert self.cache is not None, "call Transformer.setup_cache() first"
        self.cache.update(input_pos, k, v)
        y = attend(q, self.cache, input_pos, kv_len)
        return self.wo(y.transpose(1, 2).reshape(bsz, t, cfg.q_size))


class FeedForward(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.intermediate = cfg.intermediate_size
        self.w_gate_up = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.w_down = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.w_gate_up(x).split(self.intermediate, dim=-1)
        return self.w_down(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.feed_forward = FeedForward(cfg)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        input_pos: torch.Tensor,
        kv_len: int | None,
        attend: AttentionFn,
    ) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin, input_pos, kv_len, attend)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.output = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.output.weight = self.tok_embeddings.weight
        self.attend: AttentionFn = eager_attention
        self.max_context = 0

    def setup_cache(self, max_context: int) -> None:
        """Allocate the KV cache and RoPE tables for max_context positions, once."""
        param = self.tok_embeddings.weight
        dtype, device = param.dtype, param.device
        self.max_context = max_context
        for layer in self.layers:
            layer.attention.cache = KVCache(
                max_context, self.cfg.num_kv_heads, self.cfg.head_dim, dtype, device
            )
        cos, sin = cos_sin_table(self.cfg, max_context)
        self.register_buffer("rope_cos", cos.to(device=device, dtype=dtype), persistent=False)
        self.register_buffer("rope_sin", sin.to(device=device, dtype=dtype), persistent=False)

    def forward(
        self,
        tokens: torch.Tensor,
        input_pos: torch.Tensor,
        kv_len: int | None = None,
        *,
        last_only: bool = False,
    ) -> torch.Tensor:
        """tokens [1, T] at positions input_pos [T] -> logits [1, T or 1, vocab].

        kv_len: how many cache positions are filled after this call (the
        attention reads only those); None reads the whole cache (fixed shape).
        """
        x = self.tok_embeddings(tokens)
        cos, sin = self.rope_cos[input_pos], self.rope_sin[input_pos]
        for layer in self.layers:
            x = layer(x, cos, sin, input_pos, kv_len, self.attend)
        if last_only:
            x = x[:, -1:]
        result: torch.Tensor = self.output(self.norm(x))
        return result
