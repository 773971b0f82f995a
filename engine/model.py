"""The decoder: one compact Llama-family transformer (Llama 2/3, Mistral, Qwen2).

Linear layers are plain `nn.Linear` so quantisation and the GPU's GEMV can swap
them for their own modules; q/k/v and gate/up are fused into one matrix each at
load time. The glue between the matrix products (norms, RoPE + cache write,
SiLU·mul, attention) goes through `self.ops`: PyTorch on the CPU, fused Triton
kernels on the GPU. The residual add is folded into the following norm, and
on the GPU's batch-1 path the norms, SiLU·mul and residual adds fold into the
products themselves (ops.norm_linear / norm_glu / linear_residual).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from nib.engine.config import ModelConfig
from nib.engine.kv_cache import KVCache
from nib.engine.ops import AttentionFn, TorchOps
from nib.engine.rope import cos_sin_table

# (residual, pending, norm weight, eps, lm_head) -> logits, or None: Transformer.forward's
# `head` override.
Head = Callable[
    [torch.Tensor, "torch.Tensor | None", torch.Tensor, float, nn.Module], "torch.Tensor | None"
]


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

    def heads(
        self,
        qkv: torch.Tensor,
        input_pos: torch.Tensor,
        kv_len: int | None,
        attend: AttentionFn,
        rope: tuple[torch.Tensor, torch.Tensor],
        ops: TorchOps,
    ) -> torch.Tensor:
        """qkv [1, T, q+2kv] -> RoPE, cache write, attention -> [1, T, q_size] (before wo).

        One token through an attend function that carries `rope_attend` (the decode
        graph's fused CUDA kernel) takes that single launch instead."""
        cfg = self.cfg
        assert self.cache is not None, "call Transformer.setup_cache() first"
        rope_attend = getattr(attend, "rope_attend", None)
        if rope_attend is not None and qkv.shape[1] == 1:
            y = rope_attend(qkv, input_pos, rope[0], rope[1], self.cache)
        else:
            q = ops.rope_cache(
                qkv, input_pos, rope[0], rope[1], self.cache, cfg.num_heads, cfg.num_kv_heads
            )
            y = attend(q, self.cache, input_pos, kv_len)
        bsz, _, t, _ = y.shape
        return y.transpose(1, 2).reshape(bsz, t, cfg.q_size)


class FeedForward(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.w_gate_up = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.w_down = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)


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
        embed: Callable[[torch.Tensor], torch.Tensor] | None = None,
        head: Head | None = None,
    ) -> torch.Tensor:
        """tokens [1, T] at positions input_pos [T] -> logits [1, T (or 1), vocab].

        kv_len: cache positions filled after this call, for the default
        attention (None: the whole cache). last_only / gather_index (a device
        [1] index) keep one row before the lm_head. attend overrides the
        attention (the GPU graphs pass their own). embed overrides the embedding
        lookup (the decode graph's CUDA kernel, engine/cuda/embed.py): the same rows.
        head, given (residual, pending, final norm weight, eps, lm_head), may return the
        logits itself (the greedy decode graph's lm_head with the pick fused, graphs.py)
        or None for the usual final norm and lm_head.
        """
        ops, eps = self.ops, self.cfg.rms_norm_eps
        attend = attend or ops.attend
        rope = (self.rope_cos, self.rope_sin)
        residual = self.tok_embeddings(tokens) if embed is None else embed(tokens)
        # `pending` is a linear's output not yet added to the residual stream: the next
        # norm adds it (one kernel), unless the linear's kernel added it itself (None).
        pending: torch.Tensor | None = None
        for layer in self.layers:
            attn, ffn = layer.attention, layer.feed_forward
            qkv = ops.norm_linear(residual, pending, layer.attention_norm.weight, eps, attn.wqkv)
            y = attn.heads(qkv, input_pos, kv_len, attend, rope, ops)
            pending = ops.linear_residual(y, attn.wo, residual)
            h = ops.norm_glu(residual, pending, layer.ffn_norm.weight, eps, ffn.w_gate_up)
            pending = ops.linear_residual(h, ffn.w_down, residual)
        if gather_index is not None:
            residual = residual.index_select(1, gather_index)
            pending = None if pending is None else pending.index_select(1, gather_index)
        elif last_only:
            residual = residual[:, -1:]
            pending = None if pending is None else pending[:, -1:]
        if head is not None:
            picked = head(residual, pending, self.norm.weight, eps, self.output)
            if picked is not None:
                return picked
        result: torch.Tensor = ops.norm_linear(
            residual, pending, self.norm.weight, eps, self.output
        )
        return result
