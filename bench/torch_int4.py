"""The peer: PyTorch's own INT4 weight-only path, the way gpt-fast and torchao use it.

`_weight_int4pack_mm` (tinygemm) on bf16 activations, with weights packed by
`_convert_weight_to_int4pack` from uint8 [N, K/2] (even k in the high nibble),
group 128, asymmetric scales and zeros [K/128, N, 2]; the decode step (our
model code on the reference ops, attention over the whole static cache as
gpt-fast does) under torch.compile(mode="reduce-overhead").
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

GROUP = 128


class TorchInt4Linear(nn.Module):
    def __init__(self, linear: nn.Linear, inner_k_tiles: int = 8) -> None:
        super().__init__()
        w = linear.weight.detach().float()
        n, k = w.shape
        groups = w.view(n, k // GROUP, GROUP)
        lo, hi = groups.amin(-1, keepdim=True), groups.amax(-1, keepdim=True)
        scales = ((hi - lo) / 15).clamp(min=1e-6)
        q = ((groups - lo) / scales).round().clamp(0, 15).to(torch.uint8).view(n, k)
        zeros = lo + scales * 8  # tinygemm dequantises (q - 8) * scale + zero
        packed = (q[:, 0::2] << 4) | q[:, 1::2]
        self.weight = torch.ops.aten._convert_weight_to_int4pack(packed.contiguous(), inner_k_tiles)
        sz = torch.stack([scales.squeeze(-1), zeros.squeeze(-1)], dim=-1)  # [N, K/g, 2]
        self.scales_and_zeros = sz.transpose(0, 1).contiguous().to(torch.bfloat16)
        self.bias = linear.bias
        self.out_features = n

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        y = torch.ops.aten._weight_int4pack_mm(
            x.reshape(-1, shape[-1]).to(torch.bfloat16), self.weight, GROUP, self.scales_and_zeros
        )
        y = y.reshape(*shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias


def swap_torch_int4(model: nn.Module) -> None:
    for name, m in list(model.named_modules()):
        if type(m) is nn.Linear:
            parent, _, attr = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, attr, TorchInt4Linear(m))


def compiled_decode_step(model: nn.Module):  # type: ignore[no-untyped-def]
    @torch.compile(mode="reduce-overhead", fullgraph=True)
    def step(token: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        logits = model(token, pos)  # kv_len None: attention over the whole static cache
        return logits[0, -1].float().argmax(-1, keepdim=True)

    return step


def prefill(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    n = ids.shape[1]
    logits = model(ids, torch.arange(n, device=ids.device), n, last_only=True)
    return F.pad(logits[0, -1].float().argmax(-1, keepdim=True), (0, 0))
