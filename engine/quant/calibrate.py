"""Run GPTQ over a whole model: calibration samples, layer by layer, on quantised inputs.

Layer i is quantised from the inputs it sees when layers 0..i-1 already run
quantised (the paper's sequential scheme): one forward pass of the calibration
samples per layer collects the Hessians of all its linears (stopping right
after layer i), then GPTQ replaces their weights by the dequantised result.
Only the model's public forward is used, so this follows model.py wherever it goes.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from nib.engine.model import Transformer
from nib.engine.quant.format import Int4Weight
from nib.engine.quant.gptq import HessianAccumulator, gptq_quantize

log = logging.getLogger("nib.quantize")

CALIBRATION_TEXT = Path(__file__).resolve().parent / "calibration" / "python-stdlib-calibration.txt"
HELD_OUT_TEXT = Path(__file__).resolve().parent / "calibration" / "python-stdlib-heldout.txt"


class _Stop(Exception):
    """Raised by a hook to end a forward pass once the layer of interest has run."""


def calibration_samples(
    ids: list[int], n_samples: int, seq_len: int, seed: int = 0
) -> list[torch.Tensor]:
    """n_samples windows of seq_len token ids [1, seq_len], drawn at seeded random offsets."""
    if len(ids) < seq_len + 1:
        raise ValueError(f"calibration text has {len(ids)} tokens; seq_len {seq_len} needs more")
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(ids) - seq_len, (n_samples,), generator=gen).tolist()
    return [torch.tensor([ids[s : s + seq_len]], dtype=torch.long) for s in starts]


def gptq_model(
    model: Transformer,
    samples: list[torch.Tensor],
    *,
    damp: float = 0.01,
    progress: Callable[[str], None] = log.info,
) -> dict[str, Int4Weight]:
    """Quantise every decoder linear of model in place (weights become their INT4 values).

    Returns {module name: codes and scales}. The lm_head is left 16-bit (standard
    GPTQ checkpoints keep it so; nib rounds it to INT4 at load with --quant int4).
    """
    device = model.tok_embeddings.weight.device
    seq_len = max(s.shape[1] for s in samples)
    model.setup_cache(seq_len)
    result: dict[str, Int4Weight] = {}
    for i, layer in enumerate(model.layers):
        linears = {
            f"layers.{i}.{name}": m for name, m in layer.named_modules() if isinstance(m, nn.Linear)
        }
        accs = {name: HessianAccumulator(m.in_features, device) for name, m in linears.items()}
        hooks = [
            m.register_forward_pre_hook(lambda _m, args, acc=accs[name]: acc.add(args[0]))
            for name, m in linears.items()
        ]

        def stop(*_: object) -> None:
            raise _Stop

        hooks.append(layer.register_forward_hook(stop))
        try:
            with torch.no_grad():
                for s in samples:
                    t = s.shape[1]
                    with contextlib.suppress(_Stop):
                        model(s.to(device), torch.arange(t, device=device), t)
        finally:
            for h in hooks:
                h.remove()
        for name, m in linears.items():
            q = gptq_quantize(m.weight.detach(), accs[name].h, name, damp=damp)
            m.weight.data = q.dequantize(m.weight.dtype).to(device)
            result[name] = q
        progress(f"GPTQ: layer {i + 1}/{len(model.layers)} quantised")
    return result
