"""Int4Linear: the module swapped in for nn.Linear when weights are INT4.

It holds the weight in the kernel layout (packed once, at construction) and
runs the Triton kernels on CUDA and the pure-PyTorch reference elsewhere. The
model code calls it exactly as it calls nn.Linear.
"""

from __future__ import annotations

import torch
from torch import nn

from nib.engine.quant.format import GROUP_SIZE, Int4Weight, check_shape
from nib.engine.quant.layout import pack, unpack
from nib.engine.quant.reference import int4_linear_reference


class Int4Linear(nn.Module):
    """y = x @ dequant(W).T + b for W in nib's INT4 format (symmetric, group 128, fp16 scales)."""

    def __init__(
        self, weight: Int4Weight, bias: torch.Tensor | None = None, name: str = ""
    ) -> None:
        super().__init__()
        check_shape(name or "Int4Linear", weight.out_features, weight.in_features)
        self.name = name
        self.method = "rtn"  # how the codes were made (rtn | gptq), for model-info
        self.in_features = weight.in_features
        self.out_features = weight.out_features
        # The one repack after loading: codes -> the layout the kernels read.
        self.register_buffer("qweight", pack(weight.codes))
        self.register_buffer("scales", weight.scales.to(torch.float16).contiguous())
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), False)
        # The PyTorch reference even on CUDA: set on GPUs below the kernels' compute
        # capability when --allow-reference-fallback asks for it (see engine/versions.py).
        self.use_reference = False

    @classmethod
    def from_weight(
        cls,
        weight: Int4Weight,
        bias: torch.Tensor | None,
        name: str,
        device: torch.device | str | None = None,
    ) -> Int4Linear:
        module = cls(weight, bias, name)
        return module if device is None else module.to(device)

    def int4_weight(self) -> Int4Weight:
        """The logical codes and scales (to write a checkpoint)."""
        return Int4Weight(unpack(self.qweight), self.scales)

    @property
    def weight_bytes(self) -> int:
        return int(self.qweight.numel() * 4 + self.scales.numel() * 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda and not self.use_reference:
            from nib.engine.quant.kernels import int4_linear

            return int4_linear(x, self.qweight, self.scales, self.bias)
        return int4_linear_reference(x, self.qweight, self.scales, self.bias)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, int4 group={GROUP_SIZE}"
        )
