"""Random-init HF models with nib's byte-level tokenizer, sized to exercise the GPU path."""

from __future__ import annotations

from pathlib import Path

import torch

from nib.engine.default_model import write_byte_tokenizer


def save_random_hf_model(
    arch: str, out: Path, *, hidden: int = 512, layers: int = 4, seed: int = 0
) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    common = dict(
        vocab_size=384,
        hidden_size=hidden,
        intermediate_size=hidden * 3,
        num_hidden_layers=layers,
        max_position_embeddings=4096,
        eos_token_id=256,
        bos_token_id=256,
    )
    if arch == "llama":
        config = LlamaConfig(
            num_attention_heads=hidden // 64, num_key_value_heads=hidden // 64, **common
        )
        model = LlamaForCausalLM(config)
    else:
        config = Qwen2Config(num_attention_heads=hidden // 64, num_key_value_heads=2, **common)
        model = Qwen2ForCausalLM(config)
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) * 0.04)
            if name.endswith("embed_tokens.weight") or name == "lm_head.weight":
                p[256:] = 0.0  # special rows: never the argmax, so greedy runs do not end early
    model.save_pretrained(out)
    write_byte_tokenizer(out)
    return out
