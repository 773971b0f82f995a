"""nib's INT4 weight format: symmetric 4-bit codes, group 128 along the input dim, fp16 scales.

A weight W [N, K] (N outputs, K inputs) is stored as codes c in 0..15 and one
fp16 scale per (group of 128 inputs, output): W[n, k] ~ scales[k // 128, n] * (c[n, k] - 8).
This is exactly what a GPTQ checkpoint with bits=4, group_size=128, sym=True and
desc_act=False holds (its zero point is 8 for every group), so the two formats
convert into each other without re-quantising.

`Int4Weight` is the logical form (codes + scales); where the codes live in
memory is the kernel's business (see layout.py) and is decided in one place.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

BITS = 4
GROUP_SIZE = 128
ZERO_POINT = 8  # symmetric: code 8 means 0.0
MAX_CODE = 15
# The largest output dimension the kernels index with 32-bit offsets safely.
MAX_DIM = 1 << 24


class QuantShapeError(ValueError):
    """A layer whose shape nib's INT4 format cannot hold, naming the layer and the rule."""


def check_shape(name: str, out_features: int, in_features: int) -> None:
    """Reject shapes the INT4 kernels cannot run, with the layer and the rule in the message."""
    if in_features % GROUP_SIZE:
        raise QuantShapeError(
            f"{name}: in_features {in_features} is not a multiple of the group size "
            f"{GROUP_SIZE} (rule: INT4 weights need K % {GROUP_SIZE} == 0)"
        )
    if out_features % 8:
        raise QuantShapeError(
            f"{name}: out_features {out_features} is not a multiple of 8 "
            "(rule: INT4 weights need N % 8 == 0; GPTQ packs 8 zero points per int32)"
        )
    if out_features > MAX_DIM or in_features > MAX_DIM:
        raise QuantShapeError(f"{name}: dimensions above {MAX_DIM} are not supported")


@dataclass(frozen=True)
class Int4Weight:
    """codes uint8 [N, K] in 0..15 and scales fp16 [K // 128, N]."""

    codes: torch.Tensor
    scales: torch.Tensor

    def __post_init__(self) -> None:
        n, k = self.codes.shape
        if self.codes.dtype != torch.uint8:
            raise TypeError(f"codes must be uint8, not {self.codes.dtype}")
        if self.scales.shape != (k // GROUP_SIZE, n) or k % GROUP_SIZE:
            raise ValueError(
                f"scales {tuple(self.scales.shape)} do not fit codes {tuple(self.codes.shape)} "
                f"with group size {GROUP_SIZE}"
            )

    @property
    def out_features(self) -> int:
        return int(self.codes.shape[0])

    @property
    def in_features(self) -> int:
        return int(self.codes.shape[1])

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The weight these codes stand for, [N, K], computed in fp32."""
        return dequantize(self.codes, self.scales).to(dtype)

    def rows(self, start: int, stop: int) -> Int4Weight:
        """Output rows start:stop (to split a fused matrix back into its parts)."""
        return Int4Weight(self.codes[start:stop], self.scales[:, start:stop])

    @staticmethod
    def cat(parts: list[Int4Weight]) -> Int4Weight:
        """Stack along the output dimension (to fuse q/k/v or gate/up)."""
        return Int4Weight(
            torch.cat([p.codes for p in parts], dim=0), torch.cat([p.scales for p in parts], dim=1)
        )


def dequantize(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """codes uint8 [N, K], scales [K // 128, N] -> fp32 [N, K]."""
    n, k = codes.shape
    grouped = codes.view(n, k // GROUP_SIZE, GROUP_SIZE).to(torch.float32) - ZERO_POINT
    return (grouped * scales.t().to(torch.float32)[:, :, None]).view(n, k)


def group_scales(w: torch.Tensor) -> torch.Tensor:
    """Symmetric group scales of w [N, K] as GPTQ computes them: 2 * max|w| / 15, fp32 [K/128, N]."""
    n, k = w.shape
    amax = w.float().view(n, k // GROUP_SIZE, GROUP_SIZE).abs().amax(dim=-1)
    scale = 2.0 * amax / MAX_CODE
    # An all-zero group still needs a usable scale; its codes all come out as the zero point.
    return torch.where(scale > 0, scale, torch.ones_like(scale)).t().contiguous()


def quantize_with_scales(w: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Round w [N, K] to codes uint8 [N, K] with the given scales [K/128, N] (fp16-rounded)."""
    n, k = w.shape
    s = scales.to(torch.float16).float().t()[:, :, None]
    q = torch.round(w.float().view(n, k // GROUP_SIZE, GROUP_SIZE) / s) + ZERO_POINT
    return q.clamp_(0, MAX_CODE).to(torch.uint8).view(n, k)
