"""Perplexity of a model on a text: how INT4 is judged against 16-bit on held-out code."""

from __future__ import annotations

import math

import torch

from nib.engine.model import Transformer


def perplexity(model: Transformer, ids: list[int], window: int = 256) -> float:
    """exp(mean NLL) of ids under model, scored in non-overlapping windows of `window` tokens."""
    device = model.tok_embeddings.weight.device
    if model.max_context < window:
        model.setup_cache(window)
    total, count = 0.0, 0
    with torch.inference_mode():
        for start in range(0, len(ids) - 1, window):
            chunk = ids[start : start + window + 1]
            if len(chunk) < 2:
                break
            x = torch.tensor([chunk[:-1]], dtype=torch.long, device=device)
            t = x.shape[1]
            logits = model(x, torch.arange(t, device=device), t).float()
            target = torch.tensor(chunk[1:], dtype=torch.long, device=device)
            nll = torch.nn.functional.cross_entropy(logits[0], target, reduction="sum")
            total += float(nll)
            count += t
    return math.exp(total / count)
