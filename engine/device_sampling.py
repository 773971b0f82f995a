"""Sampling inside a CUDA graph: all state lives in device tensors.

The host sets temperature, top-k, top-p and the seed once per request (outside
the graph); every replay then samples from the logits with Philox noise keyed
by (seed, step) and advances `step` on the device. Greedy decoding is a
separate, cheaper graph (argmax only).
"""

from __future__ import annotations

import torch

from nib.engine.request import GenerationParams


class DeviceSampler:
    def __init__(self, vocab_size: int, device: torch.device) -> None:
        self.vocab_size = vocab_size
        self.device = device
        self.temperature = torch.ones(1, device=device)
        self.top_k = torch.zeros(1, dtype=torch.long, device=device)
        self.top_p = torch.ones(1, device=device)
        self.seed = torch.zeros(1, dtype=torch.long, device=device)
        self.step = torch.zeros(1, dtype=torch.long, device=device)
        self.noise = torch.empty(vocab_size, device=device)
        self.rank = torch.arange(vocab_size, device=device)
        # Host-side staging, copied to the device in one go per request.
        self._staging = torch.zeros(5, dtype=torch.float64)
        if device.type == "cuda":
            self._staging = self._staging.pin_memory()

    def set_request(self, params: GenerationParams, seed: int) -> None:
        """Load one request's parameters (outside any graph)."""
        s = self._staging
        s[0], s[1], s[2], s[3] = params.sampling_temperature, params.top_k, params.top_p, seed
        dev = s.to(self.device, non_blocking=True)
        self.temperature.copy_(dev[0:1])
        self.top_k.copy_(dev[1:2])
        self.top_p.copy_(dev[2:3])
        self.seed.copy_(dev[3:4].long())
        self.step.zero_()

    def set_request_defaults(self) -> None:
        self.set_request(GenerationParams(temperature=1.0), seed=0)

    @staticmethod
    def greedy(logits: torch.Tensor) -> torch.Tensor:
        """logits [V] fp32 -> token [1] int64."""
        return logits.argmax(dim=-1, keepdim=True)

    def sample(self, logits: torch.Tensor) -> torch.Tensor:
        """Temperature, top-k, top-p, then the exponential race; graph-safe."""
        from nib.engine.kernels.sampling import exp_noise

        probs = (logits / self.temperature).softmax(dim=-1)
        sorted_p, order = probs.sort(descending=True)
        before = sorted_p.cumsum(dim=-1) - sorted_p  # probability mass ranked above each token
        k = torch.where(self.top_k > 0, self.top_k, self.vocab_size)
        keep = (self.rank < k) & ((before < self.top_p) | (self.top_p >= 1.0))
        exp_noise(self.noise, self.seed, self.step)
        score = torch.where(keep, sorted_p / self.noise, -1.0)
        choice = score.argmax(dim=-1, keepdim=True)
        self.step.add_(1)
        return order.gather(0, choice)
