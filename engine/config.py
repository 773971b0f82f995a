"""Model configuration read from a Hugging Face `config.json`."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Architectures whose decoder is the one in model.py, and what differs between them.
_ARCHITECTURES = {
    "llama": {"qkv_bias_key": "attention_bias", "o_bias_key": "attention_bias"},
    "mistral": {"qkv_bias_key": None, "o_bias_key": None},
    "qwen2": {"qkv_bias_key": True, "o_bias_key": None},
}


class ConfigError(ValueError):
    """A config.json that nib cannot run, with the field and the rule in the message."""


@dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling as in HF's `rope_parameters` / `rope_scaling`."""

    rope_type: str = "default"  # default | linear | llama3
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass(frozen=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool = False
    o_bias: bool = False
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    # Mistral's sliding window; attention equals full attention while the context fits it.
    sliding_window: int | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"num_attention_heads ({self.num_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_kv_heads})"
            )

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> ModelConfig:
        """Build from the dict of a Hugging Face config.json (transformers 4.x or 5.x)."""
        model_type = cfg.get("model_type", "")
        if model_type not in _ARCHITECTURES:
            raise ConfigError(
                f"model_type {model_type!r} is not supported; nib runs {sorted(_ARCHITECTURES)}"
            )
        arch = _ARCHITECTURES[model_type]
        if cfg.get("hidden_act", "silu") != "silu":
            raise ConfigError(f"hidden_act {cfg['hidden_act']!r} is not supported; nib runs 'silu'")
        if cfg.get("mlp_bias"):
            raise ConfigError("mlp_bias=true is not supported")
        if model_type == "qwen2" and cfg.get("use_sliding_window"):
            raise ConfigError("use_sliding_window=true is not supported")

        num_heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        head_dim = int(cfg.get("head_dim") or hidden // num_heads)

        def flag(key: object) -> bool:
            return key is True or (isinstance(key, str) and bool(cfg.get(key, False)))

        rope = cfg.get("rope_parameters") or {}
        scaling = cfg.get("rope_scaling") or rope
        rope_theta = float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0)))
        rope_type = (
            scaling.get("rope_type", scaling.get("type", "default")) if scaling else "default"
        )
        if rope_type not in ("default", "linear", "llama3"):
            raise ConfigError(
                f"rope_type {rope_type!r} is not supported; nib runs default, linear and llama3"
            )
        rope_scaling = RopeScaling(
            rope_type=rope_type,
            factor=float(scaling.get("factor", 1.0)),
            low_freq_factor=float(scaling.get("low_freq_factor", 1.0)),
            high_freq_factor=float(scaling.get("high_freq_factor", 4.0)),
            original_max_position_embeddings=int(
                scaling.get("original_max_position_embeddings", 8192)
            ),
        )
        eos = cfg.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
        return cls(
            model_type=model_type,
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(cfg["intermediate_size"]),
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=num_heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or num_heads),
            head_dim=head_dim,
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=flag(arch["qkv_bias_key"]),
            o_bias=flag(arch["o_bias_key"]),
            rope_scaling=rope_scaling,
            sliding_window=cfg.get("sliding_window") if model_type == "mistral" else None,
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=eos_ids,
        )

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> ModelConfig:
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise ConfigError(f"{path} not found: a model folder needs a Hugging Face config.json")
        return cls.from_hf(json.loads(path.read_text()))
