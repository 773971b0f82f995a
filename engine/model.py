"""The decoder: one compact Llama-family transformer (Llama 2/3, Mistral, Qwen2).

Linear layers are plain `nn.Linear` so quantisation and the GPU's GEMV can swap
them for their own modules; q/k/v and gate/up are fused into one matrix each at
load time. The glue between the matrix products (norms, RoPE + cache write,
SiLU·mul, attention) goes through `self.ops`: PyTorch on the CPU, fused Triton
kernels on the GPU. The residual add is folded into the following norm.
"""

from __future__ import annotations

import torch
from torch import nn

from nib.engine.config import ModelConfig
from nib.engine.kv_cache import KVCache
from nib.engine.ops import AttentionFn, TorchOps
from nib.engine.rope import cos_sin_table


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))


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
        input_pos: torch.Tensor,
        kv_len: int | None,
        attend: AttentionFn,
        rope: tuple[torch.Tensor, torch.Tensor],
        ops: TorchOps,
    ) -> torch.Tensor:
        cfg = self.cfg
        assert self.cache is not None, "call Transformer.setup_cache() first"
        q = ops.rope_cache(
            self.wqkv(x), input_pos, rope[0], rope[1], self.cache, cfg.num_heads, cfg.num_kv_heads
        )
        y = attend(q, self.cache, input_pos, kv_len)
        bsz, _, t, _ = y.shape
        return self.wo(y.transpose(1, 2).reshape(bsz, t, cfg.q_size))


class FeedForward(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.w_gate_up = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.w_down = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, ops: TorchOps) -> torch.Tensor:
        return self.w_down(ops.silu_mul(self.w_gate_up(x)))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.feed_forward = FeedForward(cfg)


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
        self.ops = TorchOps()
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
        gather_index: torch.Tensor | None = None,
        attend: AttentionFn | None = None,
    ) -> torch.Tensor:
        """tokens [1, T] at positions input_pos [T] -> logits [1, T (or 1), vocab].

        kv_len: cache positions filled after this call, for the default
        attention (None: the whole cache). last_only / gather_index (a device
        [1] index) keep one row before the lm_head. attend overrides the
        attention (the GPU graphs pass their own).
        """
        ops, eps = self.ops, self.cfg.rms_norm_eps
        attend = attend or ops.attend
        rope = (self.rope_cos, self.rope_sin)
        residual = self.tok_embeddings(tokens)
        x = ops.rms_norm(residual, self.layers[0].attention_norm.weight, eps)
        for i, layer in enumerate(self.layers):
            x = layer.attention(x, input_pos, kv_len, attend, rope, ops)
            x = ops.add_rms_norm(x, residual, layer.ffn_norm.weight, eps)
            x = layer.feed_forward(x, ops)
            last = i + 1 == len(self.layers)
            next_norm = self.norm if last else self.layers[i + 1].attention_norm
            x = ops.add_rms_norm(x, residual, next_norm.weight, eps)
        if gather_index is not None:
            x = x.index_select(1, gather_index)
        elif last_only:
            x = x[:, -1:]
        result: torch.Tensor = self.output(x)
        return result
