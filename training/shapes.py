"""The model's shape: checked against nib's rules before a second of training is spent.

Every linear layer's input and output must be a multiple of 128 (the INT4 group
size), embeddings are tied, and the weights in bf16 must fit the repository's
budget for the shipped model (32 MiB in all, every file under 16 MiB).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

MIB = 1024 * 1024
GROUP = 128


class ShapeError(ValueError):
    """A shape that breaks one of the rules above, naming the field and the rule."""


@dataclass(frozen=True)
class ModelShape:
    vocab_size: int = 8192
    hidden_size: int = 384
    num_layers: int = 8
    num_heads: int = 6
    num_kv_heads: int = 2
    head_dim: int = 64
    intermediate_size: int = 1024
    max_position_embeddings: int = 1024
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5

    def linears(self) -> dict[str, tuple[int, int]]:
        """(in, out) of every distinct linear layer, by its Hugging Face name."""
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        return {
            "self_attn.q_proj": (self.hidden_size, q),
            "self_attn.k_proj": (self.hidden_size, kv),
            "self_attn.v_proj": (self.hidden_size, kv),
            "self_attn.o_proj": (q, self.hidden_size),
            "mlp.gate_proj": (self.hidden_size, self.intermediate_size),
            "mlp.up_proj": (self.hidden_size, self.intermediate_size),
            "mlp.down_proj": (self.intermediate_size, self.hidden_size),
            "lm_head (tied)": (self.hidden_size, self.vocab_size),
        }

    def num_parameters(self) -> int:
        per_layer = sum(i * o for name, (i, o) in self.linears().items() if "lm_head" not in name)
        per_layer += 2 * self.hidden_size  # two RMSNorm weights
        return self.vocab_size * self.hidden_size + self.num_layers * per_layer + self.hidden_size

    def weight_bytes(self, bytes_per_param: int = 2) -> int:
        return self.num_parameters() * bytes_per_param

    def validate(self, *, group: int = GROUP, max_total_bytes: int | None = 32 * MIB) -> None:
        for name, (i, o) in self.linears().items():
            if i % group or o % group:
                raise ShapeError(
                    f"{name} is {i} -> {o}: every linear's in and out must be a multiple of {group}"
                )
        if self.num_heads % self.num_kv_heads:
            raise ShapeError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )
        if max_total_bytes is not None and self.weight_bytes() > max_total_bytes:
            raise ShapeError(
                f"{self.num_parameters():,} parameters are {self.weight_bytes() / MIB:.2f} MiB in "
                f"bf16; the shipped model may take at most {max_total_bytes / MIB:.0f} MiB"
            )

    def hf_config(self, eos_id: int) -> dict[str, Any]:
        """Keyword arguments for transformers.LlamaConfig."""
        return {
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "hidden_act": "silu",
            "tie_word_embeddings": True,
            "attention_bias": False,
            "mlp_bias": False,
            "bos_token_id": eos_id,
            "eos_token_id": eos_id,
            "pad_token_id": eos_id,
            "use_cache": True,
        }

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# The shipped model: 15,735,168 parameters, 30.0 MiB in bf16.
H200 = ModelShape()
# The smoke test's model: every rule still holds, trains in seconds on a CPU.
TINY = ModelShape(
    vocab_size=512,
    hidden_size=128,
    num_layers=2,
    num_heads=2,
    num_kv_heads=1,
    head_dim=128,
    intermediate_size=256,
    max_position_embeddings=256,
)
