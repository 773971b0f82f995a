"""Random-init Hugging Face models saved to disk, to load into nib and compare."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

SHAPES: dict[str, dict[str, Any]] = {
    "llama-tied-gqa": dict(
        arch="llama", tie_word_embeddings=True, num_attention_heads=4, num_key_value_heads=2
    ),
    "llama3-rope-scaling": dict(
        arch="llama",
        num_attention_heads=4,
        num_key_value_heads=1,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    ),
    "qwen2-bias-untied": dict(arch="qwen2", num_attention_heads=4, num_key_value_heads=2),
    "mistral": dict(
        arch="mistral", num_attention_heads=4, num_key_value_heads=2, sliding_window=None
    ),
}


def save_hf_model(name: str, out: Path, seed: int = 0) -> torch.nn.Module:
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        MistralConfig,
        MistralForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    kinds = {
        "llama": (LlamaConfig, LlamaForCausalLM),
        "qwen2": (Qwen2Config, Qwen2ForCausalLM),
        "mistral": (MistralConfig, MistralForCausalLM),
    }
    spec = dict(SHAPES[name])
    config_cls, model_cls = kinds[spec.pop("arch")]
    config = config_cls(
        vocab_size=384,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        max_position_embeddings=512,
        **spec,
    )
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    # HF initialises biases and norms to constants; randomise them so a wrong mapping shows.
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith("bias") or "norm" in pname:
                p.copy_(
                    1.0 + 0.1 * torch.randn_like(p)
                    if "norm" in pname
                    else 0.1 * torch.randn_like(p)
                )
    model.save_pretrained(out)
    return model
