"""Token sampling: greedy, temperature, top-k, top-p, seeded per request."""

from __future__ import annotations

import torch

from nib.engine.request import GenerationParams


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Set logits outside the top-k / top-p set to -inf. logits [..., V] fp32."""
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if 0.0 < top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        # Drop a token when the tokens before it already reach top_p (the first always stays).
        drop_sorted = (cum - sorted_logits.softmax(dim=-1)) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


class Sampler:
    """Samples one token from [V] fp32 logits; same seed, same tokens."""

    def __init__(self, params: GenerationParams, device: torch.device) -> None:
        self.params = params
        self.generator: torch.Generator | None = None
        if not params.greedy:
            self.generator = torch.Generator(device=device)
            if params.seed is None:
                self.generator.seed()
            else:
                self.generator.manual_seed(params.seed)

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        """Return the chosen token id as a 1-element int64 tensor on logits' device."""
        p = self.params
        if p.greedy:
            return logits.argmax(dim=-1, keepdim=True)
        filtered = filter_logits(logits / p.sampling_temperature, p.top_k, p.top_p)
        probs = filtered.softmax(dim=-1)
        return torch.multinomial(probs, 1, generator=self.generator)
