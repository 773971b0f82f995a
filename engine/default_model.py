"""Which model `nib serve` runs when given none, and a random-init test model maker.

The shipped model lives in engine/assets/ (see its model card). Until it is
present, or for tests, `make_random_model` writes a small randomly initialised
Llama-shaped model with a byte-level tokenizer: deterministic, clearly
labelled, and producing noise rather than code.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

log = logging.getLogger("nib.engine")

SHIPPED_MODEL = Path(__file__).resolve().parent / "assets" / "nib-tiny-code"
RANDOM_MODEL_NAME = "nib-random-test-model"
RANDOM_VOCAB = 384  # 256 bytes + specials + placeholders: a multiple of 128
SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|fim_prefix|>",
    "<|fim_suffix|>",
    "<|fim_middle|>",
    "<|file_sep|>",
)


def default_model_dir() -> Path:
    """The shipped model if it is installed, else a cached random-init test model."""
    if (SHIPPED_MODEL / "config.json").is_file():
        return SHIPPED_MODEL
    cache = Path(os.environ.get("NIB_CACHE", Path.home() / ".cache" / "nib")) / RANDOM_MODEL_NAME
    if not (cache / "config.json").is_file():
        make_random_model(cache)
    log.warning(
        "no shipped model found: serving %s, a RANDOM-INIT TEST MODEL (noise, not code)", cache
    )
    return cache


def byte_level_tokenizer() -> Tokenizer:
    """A byte-level tokenizer with no merges: 256 byte tokens, the special tokens, then
    plain placeholder tokens up to 384 ids, so every id a model of that vocabulary
    samples decodes to some text."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    tok.add_tokens([f"<|unused_{i}|>" for i in range(RANDOM_VOCAB - tok.get_vocab_size())])
    return tok


def write_byte_tokenizer(out_dir: str | Path) -> None:
    """Save the byte-level tokenizer (384 ids) into a model folder."""
    out = Path(out_dir)
    byte_level_tokenizer().save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps({"eos_token": "<|endoftext|>", "tokenizer_class": "PreTrainedTokenizerFast"})
        + "\n"
    )


def make_random_model(
    out_dir: str | Path,
    *,
    hidden_size: int = 128,
    intermediate_size: int = 384,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    max_position_embeddings: int = 2048,
    seed: int = 0,
) -> Path:
    """Write a deterministic random-init Llama model folder (HF layout) and return it."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = byte_level_tokenizer()
    vocab_size = RANDOM_VOCAB
    eos_id = tok.token_to_id("<|endoftext|>")
    head_dim = hidden_size // num_heads
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_act": "silu",
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "intermediate_size": intermediate_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_kv_heads,
        "head_dim": head_dim,
        "max_position_embeddings": max_position_embeddings,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": True,
        "attention_bias": False,
        "bos_token_id": eos_id,
        "eos_token_id": eos_id,
        "torch_dtype": "float32",
        "nib_note": "random-init test model made by nib.engine.default_model; not trained",
    }
    gen = torch.Generator().manual_seed(seed)

    def w(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * 0.05

    q, kv = num_heads * head_dim, num_kv_heads * head_dim
    # Three times the other weights: a wide spread of logits, so that the zeroed special rows
    # below (logit 0) are also unlikely when sampling at temperature 1.
    embed = w(vocab_size, hidden_size) * 3
    # End-of-text and the FIM markers (which also end a completion) get logit 0, so
    # decoding rarely ends at once; the placeholder ids after them stay random.
    embed[256 : 256 + len(SPECIAL_TOKENS)] = 0.0
    tensors = {"model.embed_tokens.weight": embed}
    tensors["model.norm.weight"] = torch.ones(hidden_size)
    for i in range(num_layers):
        p = f"model.layers.{i}"
        tensors[f"{p}.input_layernorm.weight"] = torch.ones(hidden_size)
        tensors[f"{p}.post_attention_layernorm.weight"] = torch.ones(hidden_size)
        tensors[f"{p}.self_attn.q_proj.weight"] = w(q, hidden_size)
        tensors[f"{p}.self_attn.k_proj.weight"] = w(kv, hidden_size)
        tensors[f"{p}.self_attn.v_proj.weight"] = w(kv, hidden_size)
        tensors[f"{p}.self_attn.o_proj.weight"] = w(hidden_size, q)
        tensors[f"{p}.mlp.gate_proj.weight"] = w(intermediate_size, hidden_size)
        tensors[f"{p}.mlp.up_proj.weight"] = w(intermediate_size, hidden_size)
        tensors[f"{p}.mlp.down_proj.weight"] = w(hidden_size, intermediate_size)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps({"eos_token": "<|endoftext|>", "tokenizer_class": "PreTrainedTokenizerFast"})
        + "\n"
    )
    (out / "README.md").write_text(
        "# nib random-init test model\n\nRandomly initialised, not trained: it produces noise. "
        "Made by `nib.engine.default_model.make_random_model` for tests and as a stand-in "
        "until the shipped model is installed.\n"
    )
    return out
