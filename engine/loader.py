"""Load a Hugging Face model folder (config.json + *.safetensors) into model.py's Transformer."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import torch
from safetensors import safe_open

from nib.engine.config import ConfigError, ModelConfig
from nib.engine.model import Transformer


class CheckpointError(ValueError):
    """A checkpoint whose tensors do not match its config, naming the tensor."""


def safetensors_files(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return sorted({model_dir / name for name in weight_map.values()})
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ConfigError(f"no *.safetensors in {model_dir}")
    return files


def _hf_to_nib(cfg: ModelConfig) -> Iterator[tuple[str, list[str]]]:
    """(nib parameter name, HF tensor names concatenated along dim 0 to make it)."""
    yield "tok_embeddings.weight", ["model.embed_tokens.weight"]
    yield "norm.weight", ["model.norm.weight"]
    if not cfg.tie_word_embeddings:
        yield "output.weight", ["lm_head.weight"]
    for i in range(cfg.num_layers):
        hf, nib = f"model.layers.{i}", f"layers.{i}"
        yield f"{nib}.attention_norm.weight", [f"{hf}.input_layernorm.weight"]
        yield f"{nib}.ffn_norm.weight", [f"{hf}.post_attention_layernorm.weight"]
        qkv = [f"{hf}.self_attn.{p}_proj" for p in "qkv"]
        yield f"{nib}.attention.wqkv.weight", [f"{n}.weight" for n in qkv]
        if cfg.qkv_bias:
            yield f"{nib}.attention.wqkv.bias", [f"{n}.bias" for n in qkv]
        yield f"{nib}.attention.wo.weight", [f"{hf}.self_attn.o_proj.weight"]
        if cfg.o_bias:
            yield f"{nib}.attention.wo.bias", [f"{hf}.self_attn.o_proj.bias"]
        yield (
            f"{nib}.feed_forward.w_gate_up.weight",
            [f"{hf}.mlp.gate_proj.weight", f"{hf}.mlp.up_proj.weight"],
        )
        yield f"{nib}.feed_forward.w_down.weight", [f"{hf}.mlp.down_proj.weight"]


def load_model(
    model_dir: str | Path,
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> Transformer:
    """Build the model on the meta device, then assign the checkpoint's tensors."""
    model_dir = Path(model_dir)
    cfg = ModelConfig.from_dir(model_dir)
    with ExitStack() as stack:
        handles = [
            stack.enter_context(safe_open(str(f), "pt")) for f in safetensors_files(model_dir)
        ]
        where = {name: h for h in handles for name in h.keys()}  # noqa: SIM118 (safe_open has no __iter__)
        return build_model(
            cfg,
            {n: (lambda n=n: where[n].get_tensor(n)) for n in where},
            dtype,
            device,
            str(model_dir),
        )


def build_model(
    cfg: ModelConfig,
    tensors: dict[str, Callable[[], torch.Tensor]],
    dtype: torch.dtype,
    device: str | torch.device,
    source: str = "checkpoint",
) -> Transformer:
    """Assemble a Transformer from HF-named tensors (loaded lazily, one at a time)."""
    with torch.device("meta"):
        model = Transformer(cfg)
    params = dict(model.named_parameters())
    used: set[str] = set()
    state: dict[str, torch.Tensor] = {}
    for name, sources in _hf_to_nib(cfg):
        missing = [s for s in sources if s not in tensors]
        if missing:
            raise CheckpointError(f"{source}: tensor {missing[0]} is missing")
        parts = [tensors[s]() for s in sources]
        tensor = torch.cat(parts, dim=0) if len(parts) > 1 else parts[0]
        expected = params[name].shape
        if tensor.shape != expected:
            raise CheckpointError(
                f"{source}: {' + '.join(sources)} has shape {tuple(tensor.shape)}, "
                f"config.json implies {tuple(expected)}"
            )
        state[name] = tensor.to(device=device, dtype=dtype)
        used.update(sources)
    # Tied checkpoints sometimes carry a copy of the embedding as lm_head; others are errors.
    extra = sorted(
        n for n in set(tensors) - used - {"lm_head.weight"} if not n.endswith("rotary_emb.inv_freq")
    )
    if extra:
        raise CheckpointError(f"{source}: unexpected tensor {extra[0]} (and {len(extra) - 1} more)")
    model.load_state_dict(state, strict=False, assign=True)
    if cfg.tie_word_embeddings:
        model.output.weight = model.tok_embeddings.weight
    leftover = [n for n, p in model.named_parameters() if p.is_meta]
    if leftover:
        raise CheckpointError(f"{source}: no tensor for {leftover[0]}")
    return model.eval()
