"""Int4Linear: the module swapped in for nn.Linear when weights are INT4.

It holds the weight in the kernel layout (packed once, at construction) and
runs the pure-PyTorch reference on the CPU. On a GPU, `use_cuda` repacks it
once into the order of nib's CUDA tensor-core kernel (engine/cuda/w4a16.py),
which then serves every row count and the fused glue, and frees the first
packing; where that kernel cannot run, the Triton kernels do. The model code
calls it exactly as it calls nn.Linear.
"""

from __future__ import annotations

from typing import Any

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
        # The batch-1 GEMV (quant/fused_gemv.py), set on the GPU by `use_gemv`: tile
        # configs for the plain product (`m1`) and for the fused glue (`fused`, named by
        # `fusion` as in kernels/gemv.py's FUSIONS), and their split-K buffers.
        self.m1: Any = None
        self.fusion = ""
        self.fused: Any = None
        self.buffers: Any = None
        self.fused_buffers: Any = None
        # The CUDA tensor-core path (engine/cuda/w4a16.py CudaInt4), set by `use_cuda`.
        self.cuda: Any = None

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

    def use_gemv(self, m1: Any, fusion: str = "", fused: Any = None) -> None:
        """Run one-row inputs on the batch-1 GEMV with these Int4GemvConfigs (None: the
        general kernels); `fused` enables the fused glue named by `fusion`."""
        from nib.engine.quant.fused_gemv import split_buffers

        device = self.qweight.device
        self.m1 = m1
        self.fusion = fusion if fused is not None else ""
        self.fused = fused
        self.buffers = None if m1 is None else split_buffers(self.out_features, m1, device)
        fused_n = self.out_features // 2 if self.fusion == "norm_glu" else self.out_features
        self.fused_buffers = None if fused is None else split_buffers(fused_n, fused, device)

    def use_cuda(self, packed: Any) -> None:
        """Serve every call with nib's CUDA kernel on this repacked weight (a CudaInt4 built
        from this module's codes). The layout.py packing is freed: the CUDA path covers
        one row (with `packed.fusion` fused), 2..16 rows and prefill."""
        self.cuda = packed
        self.fusion = packed.fusion
        self.fused = packed.one_row if packed.fusion else None
        self.m1 = None
        self.qweight = torch.empty(0, dtype=torch.int32, device=packed.device)

    def kernel(self, rows: int) -> str | None:
        """The batch-1 GEMV's label for one row (with its fusion), else None."""
        if self.cuda is not None:
            if rows == 1:
                label = self.cuda.effective(self.cuda.one_row, 1).label()
                return f"{label} +{self.fusion}" if self.fusion else label
            if rows <= 16:
                return str(self.cuda.effective(self.cuda.multi_row, rows).label())
            return "int4 mma16 dequant+cublas"
        if rows != 1 or self.use_reference or self.qweight.device.type != "cuda":
            return None
        if self.fused is not None:
            return f"{self.fused.label()} +{self.fusion}"
        return None if self.m1 is None else str(self.m1.label())

    def norm_forward(
        self, h: torch.Tensor, norm_weight: torch.Tensor, eps: float, glu: bool, pick: Any = None
    ) -> torch.Tensor:
        """The fused kernel: self(rms_norm(h) * norm_weight), silu(gate) * up with glu.
        `pick` (engine/cuda/w4a16.py PickPtrs; the CUDA kernel only): the greedy
        pick of the result in the same launch."""
        if self.cuda is not None:
            if glu != self.cuda.glu:
                raise ValueError(f"{self.name}: packed for fusion {self.fusion!r}, not glu={glu}")
            out: torch.Tensor = self.cuda.norm(h, norm_weight, eps, pick=pick)
            return out
        if pick is not None:
            raise ValueError(f"{self.name}: the fused pick needs the CUDA INT4 kernel")
        from nib.engine.quant.fused_gemv import norm_gemv

        return norm_gemv(
            h, norm_weight, eps, self.qweight, self.scales, self.bias, self.fused, glu,
            self.fused_buffers,
        )  # fmt: skip

    def residual_forward(self, x: torch.Tensor, residual: torch.Tensor) -> None:
        """The fused kernel: residual += self(x), in place."""
        if self.cuda is not None:
            self.cuda.residual(x, residual)
            return
        from nib.engine.quant.fused_gemv import gemv_residual

        gemv_residual(
            x, self.qweight, self.scales, self.bias, residual, self.fused, self.fused_buffers
        )

    def codes(self) -> torch.Tensor:
        """The logical codes uint8 [N, K], from whichever packing the module holds."""
        if self.cuda is not None:
            return self.cuda.unpack()[0]  # type: ignore[no-any-return]
        return unpack(self.qweight)

    def int4_weight(self) -> Int4Weight:
        """The logical codes and scales (to write a checkpoint)."""
        return Int4Weight(self.codes(), self.scales)

    def dequantized(self) -> torch.Tensor:
        """The weight the codes stand for, fp32 [N, K] (references and self-checks)."""
        return self.int4_weight().dequantize()

    @property
    def weight_bytes(self) -> int:
        if self.cuda is not None:
            return int(self.cuda.weight_bytes)
        return int(self.qweight.numel() * 4 + self.scales.numel() * 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.cuda is not None and x.is_cuda and not self.use_reference:
            return self.cuda.linear(x)  # type: ignore[no-any-return]
        if x.is_cuda and not self.use_reference:
            if self.m1 is not None and x.numel() == self.in_features:
                from nib.engine.quant.fused_gemv import gemv

                return gemv(x, self.qweight, self.scales, self.bias, self.m1, self.buffers)
            from nib.engine.quant.kernels import int4_linear

            return int4_linear(x, self.qweight, self.scales, self.bias)
        if self.cuda is not None:  # the reference after a CUDA repack: from the logical codes
            out = x.to(torch.float32) @ self.dequantized().t()
            out = out if self.bias is None else out + self.bias.to(torch.float32)
            return out.to(x.dtype)
        return int4_linear_reference(x, self.qweight, self.scales, self.bias)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, int4 group={GROUP_SIZE}"
        )
