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
from nib.engine.quant.format import Int4Weight
from nib.engine.quant.gptq_format import GptqConfig, from_gptq, read_gptq_config
from nib.engine.quant.linear import Int4Linear
from nib.engine.quant.swap import quantize_model

QUANT_MODES = ("auto", "none", "int4")
_GPTQ_TENSORS = ("qweight", "qzeros", "scales", "g_idx")


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


Getter = Callable[[], torch.Tensor]


def _read_gptq_linear(
    sources: list[str], tensors: dict[str, Getter], gptq: GptqConfig
) -> tuple[Int4Weight, list[str]] | None:
    """The INT4 weight of a GPTQ-quantised linear (parts fused along N), or None if 16-bit."""
    prefixes = [s.removesuffix(".weight") for s in sources]
    if not all(f"{p}.qweight" in tensors for p in prefixes):
        return None
    parts, used = [], []
    for p in prefixes:
        names = [f"{p}.{t}" for t in _GPTQ_TENSORS if f"{p}.{t}" in tensors]
        loaded = {n.rsplit(".", 1)[1]: tensors[n]() for n in names}
        parts.append(from_gptq(p, loaded, gptq, int(loaded["qweight"].shape[1])))
        used += names
    return Int4Weight.cat(parts), used


def load_model(
    model_dir: str | Path,
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    quant: str = "auto",
) -> Transformer:
    """Build the model on the meta device, then assign the checkpoint's tensors.

    quant: "auto" runs the checkpoint as it is (GPTQ -> INT4, 16-bit -> 16-bit);
    "int4" also quantises every remaining 16-bit linear (round-to-nearest);
    "none" runs 16-bit and refuses GPTQ checkpoints.
    """
    model_dir = Path(model_dir)
    if quant not in QUANT_MODES:
        raise ConfigError(f"quant {quant!r} is not one of {QUANT_MODES}")
    cfg = ModelConfig.from_dir(model_dir)
    gptq = read_gptq_config(model_dir)
    if gptq is not None:
        gptq.check(str(model_dir))
        if quant == "none":
            raise ConfigError(
                f"{model_dir} is a GPTQ INT4 checkpoint; serve it with quant 'int4' or 'auto'"
            )
    with ExitStack() as stack:
        handles = [
            stack.enter_context(safe_open(str(f), "pt")) for f in safetensors_files(model_dir)
        ]
        where = {name: h for h in handles for name in h.keys()}  # noqa: SIM118 (safe_open has no __iter__)
        getters: dict[str, Getter] = {n: (lambda n=n: where[n].get_tensor(n)) for n in where}
        return build_model(cfg, getters, dtype, device, str(model_dir), gptq=gptq, quant=quant)


def build_model(
    cfg: ModelConfig,
    tensors: dict[str, Getter],
    dtype: torch.dtype,
    device: str | torch.device,
    source: str = "checkpoint",
    *,
    gptq: GptqConfig | None = None,
    quant: str = "auto",
) -> Transformer:
    """Assemble a Transformer from HF-named tensors (each loaded when needed)."""
    with torch.device("meta"):
        model = Transformer(cfg)
    params = dict(model.named_parameters())
    used: set[str] = set()
    state: dict[str, torch.Tensor] = {}
    int4: dict[str, Int4Weight] = {}
    for name, sources in _hf_to_nib(cfg):
        found = None if gptq is None else _read_gptq_linear(sources, tensors, gptq)
        if found is not None:
            weight, names = found
            expected = params[name].shape
            if (weight.out_features, weight.in_features) != tuple(expected):
                raise CheckpointError(
                    f"{source}: {' + '.join(sources)} (GPTQ) hold "
                    f"{(weight.out_features, weight.in_features)}, config.json implies "
                    f"{tuple(expected)}"
                )
            int4[name.removesuffix(".weight")] = weight
            used.update(names)
            continue
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
    for module_name, weight in int4.items():
        old = model.get_submodule(module_name)
        bias = None if old.bias is None or old.bias.is_meta else old.bias
        new = Int4Linear(weight, bias, module_name).to(device)
        new.method = "gptq"
        model.set_submodule(module_name, new)
    if cfg.tie_word_embeddings:
        model.output.weight = model.tok_embeddings.weight
    leftover = [n for n, p in model.named_parameters() if p.is_meta]
    if leftover:
        raise CheckpointError(f"{source}: no tensor for {leftover[0]}")
    if quant == "int4":
        quantize_model(model)  # the linears still 16-bit (all of them, or a GPTQ lm_head)
    return model.eval()
