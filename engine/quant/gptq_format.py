"""The standard GPTQ checkpoint format (AutoGPTQ / GPTQModel "gptq" v1 layout), 4-bit.

Per quantised linear `<name>`: `qweight` int32 [K/8, N] (code of input 8i+j in
bits 4j..4j+3 of row i), `qzeros` int32 [K/G, N/8] (zero point of output 8c+j
in bits 4j.., stored minus one in the v1 layout), `scales` fp16 [K/G, N],
`g_idx` int32 [K] (the group of each input). The weight is
scales[g_idx[k], n] * (code - zero). nib's format is the sym=True,
desc_act=False, group 128 case: every zero is 8 and g_idx[k] = k // 128.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from nib.engine.quant.format import BITS, GROUP_SIZE, ZERO_POINT, Int4Weight, QuantShapeError

CONFIG_FILE = "quantize_config.json"


class GptqFormatError(ValueError):
    """A GPTQ checkpoint nib cannot run as it is, naming the tensor or setting and the rule."""


@dataclass(frozen=True)
class GptqConfig:
    bits: int = BITS
    group_size: int = GROUP_SIZE
    sym: bool = True
    desc_act: bool = False
    # "gptq" (v1: zeros stored minus one, what checkpoints on disk use) or "gptq_v2".
    checkpoint_format: str = "gptq"

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GptqConfig:
        return cls(
            bits=int(d.get("bits", BITS)),
            group_size=int(d.get("group_size", GROUP_SIZE)),
            sym=bool(d.get("sym", True)),
            desc_act=bool(d.get("desc_act", False)),
            checkpoint_format=str(d.get("checkpoint_format", "gptq")),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "bits": self.bits,
            "group_size": self.group_size,
            "desc_act": self.desc_act,
            "sym": self.sym,
            "static_groups": False,
            "true_sequential": False,  # one calibration pass per layer (calibrate.py)
            "damp_percent": 0.01,
            "lm_head": False,
            "quant_method": "gptq",
            "checkpoint_format": self.checkpoint_format,
        }

    def check(self, where: str) -> None:
        """Refuse settings nib's kernels do not run (act-order is checked per layer)."""
        rules = [
            (self.bits == BITS, f"bits={self.bits}; nib runs bits={BITS}"),
            (
                self.group_size == GROUP_SIZE,
                f"group_size={self.group_size}; nib runs group_size={GROUP_SIZE}",
            ),
            (self.sym, "sym=false (asymmetric zero points); nib runs sym=true"),
            (
                self.checkpoint_format in ("gptq", "gptq_v2"),
                f"checkpoint_format={self.checkpoint_format!r}; nib reads 'gptq' and 'gptq_v2'",
            ),
        ]
        for ok, why in rules:
            if not ok:
                raise GptqFormatError(f"{where}: GPTQ {why}")


def read_gptq_config(model_dir: Path) -> GptqConfig | None:
    """The checkpoint's GPTQ settings, or None if it is not a GPTQ checkpoint."""
    qc = model_dir / CONFIG_FILE
    if qc.is_file():
        return GptqConfig.from_dict(json.loads(qc.read_text()))
    cfg = model_dir / "config.json"
    if cfg.is_file():
        q = json.loads(cfg.read_text()).get("quantization_config")
        if isinstance(q, dict):
            if q.get("quant_method") != "gptq":
                raise GptqFormatError(
                    f"{cfg}: quantization_config.quant_method={q.get('quant_method')!r}; "
                    "nib loads 16-bit checkpoints and GPTQ ('gptq') ones"
                )
            return GptqConfig.from_dict(q)
    return None


def _pack_rows(values: torch.Tensor) -> torch.Tensor:
    """int [R, C] nibbles -> int32 [R/8, C]: value of row 8i+j in bits 4j.. of row i."""
    r, c = values.shape
    v = values.to(torch.int64).view(r // 8, 8, c)
    word = torch.zeros(r // 8, c, dtype=torch.int64)
    for j in range(8):
        word |= v[:, j] << (4 * j)
    return torch.where(word >= 2**31, word - 2**32, word).to(torch.int32)


def _unpack_rows(words: torch.Tensor) -> torch.Tensor:
    """int32 [R/8, C] -> int64 [R, C] nibbles (inverse of _pack_rows)."""
    w = words.to(torch.int64) & 0xFFFFFFFF
    r8, c = w.shape
    return torch.stack([(w >> (4 * j)) & 0xF for j in range(8)], dim=1).view(r8 * 8, c)


def to_gptq(weight: Int4Weight, cfg: GptqConfig | None = None) -> dict[str, torch.Tensor]:
    """nib's codes and scales -> qweight, qzeros, scales, g_idx as a GPTQ checkpoint stores them."""
    cfg = cfg or GptqConfig()
    n, k = weight.out_features, weight.in_features
    stored_zero = ZERO_POINT - 1 if cfg.checkpoint_format == "gptq" else ZERO_POINT
    zeros = torch.full((k // GROUP_SIZE, n), stored_zero, dtype=torch.int64)
    return {
        "qweight": _pack_rows(weight.codes.cpu().t()),
        "qzeros": _pack_rows(zeros.t()).t().contiguous(),
        "scales": weight.scales.cpu().to(torch.float16).contiguous(),
        "g_idx": (torch.arange(k, dtype=torch.int32) // GROUP_SIZE),
    }


def from_gptq(
    name: str, tensors: dict[str, torch.Tensor], cfg: GptqConfig, out_features: int
) -> Int4Weight:
    """A GPTQ layer's tensors -> nib's codes and scales, refusing what nib cannot run exactly."""
    qweight, qzeros, scales = tensors["qweight"], tensors["qzeros"], tensors["scales"]
    k = qweight.shape[0] * 8
    n = qweight.shape[1]
    if n != out_features:
        raise GptqFormatError(f"{name}.qweight has {n} outputs, config.json implies {out_features}")
    if k % GROUP_SIZE:
        raise QuantShapeError(f"{name}: in_features {k} is not a multiple of {GROUP_SIZE}")
    groups = k // GROUP_SIZE
    if tuple(scales.shape) != (groups, n) or tuple(qzeros.shape) != (groups, n // 8):
        raise GptqFormatError(
            f"{name}: scales {tuple(scales.shape)} / qzeros {tuple(qzeros.shape)} do not fit "
            f"qweight {tuple(qweight.shape)} with group size {GROUP_SIZE}"
        )
    g_idx = tensors.get("g_idx")
    if g_idx is not None:
        expected = torch.arange(k, dtype=torch.int64) // GROUP_SIZE
        if not torch.equal(g_idx.to(torch.int64), expected):
            raise GptqFormatError(
                f"{name}.g_idx is not k // {GROUP_SIZE}: this is an act-order (desc_act=True) "
                "checkpoint whose groups are permuted along the input; nib's kernels need "
                f"contiguous groups (desc_act=False). Re-quantise with `nib quantize`."
            )
    zeros = _unpack_rows(qzeros.t().contiguous()).t()
    if cfg.checkpoint_format == "gptq":
        zeros = zeros + 1
    if not bool((zeros == ZERO_POINT).all()):
        raise GptqFormatError(
            f"{name}.qzeros: zero points other than {ZERO_POINT} (an asymmetric checkpoint); "
            "nib runs sym=true"
        )
    codes = _unpack_rows(qweight).t().contiguous().to(torch.uint8)
    return Int4Weight(codes, scales.to(torch.float16).contiguous())
