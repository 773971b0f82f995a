"""Write a standard GPTQ checkpoint (HF layout) from a 16-bit model folder and its INT4 weights.

q/k/v and gate/up are written unfused, under their Hugging Face names, as any
GPTQ loader expects; nib fuses them again when it loads the checkpoint.
Tensors that are not quantised are copied from the source as fp16.
"""

from __future__ import annotations

import json
import shutil
from contextlib import ExitStack
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from nib.engine.config import ModelConfig
from nib.engine.loader import _hf_to_nib, safetensors_files
from nib.engine.quant.format import Int4Weight
from nib.engine.quant.gptq_format import CONFIG_FILE, GptqConfig, to_gptq


def save_gptq_checkpoint(
    src_dir: Path, out_dir: Path, weights: dict[str, Int4Weight], cfg: GptqConfig | None = None
) -> Path:
    """weights: {nib module name, e.g. 'layers.0.attention.wqkv': codes and scales}."""
    cfg = cfg or GptqConfig()
    src_dir, out_dir = Path(src_dir), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model_cfg = ModelConfig.from_dir(src_dir)
    tensors: dict[str, torch.Tensor] = {}
    with ExitStack() as stack:
        handles = [stack.enter_context(safe_open(str(f), "pt")) for f in safetensors_files(src_dir)]
        where = {name: h for h in handles for name in h.keys()}  # noqa: SIM118
        quantised: set[str] = set()
        for name, sources in _hf_to_nib(model_cfg):
            module = name.removesuffix(".weight")
            if not name.endswith(".weight") or module not in weights:
                continue
            weight, start = weights[module], 0
            for src in sources:
                rows = int(where[src].get_slice(src).get_shape()[0])
                prefix = src.removesuffix(".weight")
                for key, t in to_gptq(weight.rows(start, start + rows), cfg).items():
                    tensors[f"{prefix}.{key}"] = t
                start += rows
                quantised.add(src)
            if start != weight.out_features:
                raise ValueError(
                    f"{module}: parts hold {start} rows, INT4 weight has {weight.out_features}"
                )
        for src, handle in where.items():
            if src not in quantised:
                t = handle.get_tensor(src)
                tensors[src] = t.to(torch.float16) if t.is_floating_point() else t
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})

    hf_config = json.loads((src_dir / "config.json").read_text())
    hf_config["quantization_config"] = cfg.to_dict()
    hf_config["torch_dtype"] = "float16"
    (out_dir / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
    (out_dir / CONFIG_FILE).write_text(json.dumps(cfg.to_dict(), indent=2) + "\n")
    for f in src_dir.iterdir():
        skip = f.suffix == ".safetensors" or f.name in (
            "config.json",
            "model.safetensors.index.json",
        )
        if f.is_file() and not skip:
            shutil.copy2(f, out_dir / f.name)
    return out_dir
