"""Write the trained model as a Hugging Face folder: bf16 safetensors shards plus an index.

Shards are capped well under the 16 MiB per-file limit. The tied output layer is
not stored (`tie_word_embeddings` in config.json ties it again on load), so each
weight crosses the disk once.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import GenerationConfig, LlamaForCausalLM

MIB = 1024 * 1024
INDEX = "model.safetensors.index.json"


def shard_plan(sizes: list[tuple[str, int]], max_shard_bytes: int) -> list[list[str]]:
    """Tensor names grouped, in order, into shards of at most max_shard_bytes each."""
    shards: list[list[str]] = [[]]
    used = 0
    for name, nbytes in sizes:
        if nbytes > max_shard_bytes:
            raise ValueError(
                f"{name} is {nbytes} bytes, more than a whole shard ({max_shard_bytes})"
            )
        if shards[-1] and used + nbytes > max_shard_bytes:
            shards.append([])
            used = 0
        shards[-1].append(name)
        used += nbytes
    return shards


def save_model(
    model: LlamaForCausalLM, out_dir: Path, max_shard_bytes: int = 12 * MIB
) -> list[Path]:
    """config.json, generation_config.json, the shards and their index; returns the shard paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    state = {
        name: t.detach().to(device="cpu", dtype=torch.bfloat16).contiguous()
        for name, t in model.state_dict().items()
        if not (model.config.tie_word_embeddings and name == "lm_head.weight")
    }
    sizes = [(n, t.numel() * t.element_size()) for n, t in state.items()]
    plan = shard_plan(sizes, max_shard_bytes)
    weight_map: dict[str, str] = {}
    paths = []
    for i, names in enumerate(plan, start=1):
        file = f"model-{i:05d}-of-{len(plan):05d}.safetensors"
        save_file({n: state[n] for n in names}, str(out_dir / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(names, file))
        paths.append(out_dir / file)
    index = {"metadata": {"total_size": sum(b for _, b in sizes)}, "weight_map": weight_map}
    (out_dir / INDEX).write_text(json.dumps(index, indent=2) + "\n")

    config = model.config
    config.architectures = ["LlamaForCausalLM"]
    config.use_cache = True
    config.dtype = torch.bfloat16
    config.save_pretrained(out_dir)
    eos = config.eos_token_id
    GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=eos, pad_token_id=eos, do_sample=False
    ).save_pretrained(out_dir)
    return paths
