"""Write tests/data/gptqmodel-golden.safetensors with GPTQModel's own packing code.

Run where `gptqmodel` is installed (it is not a dependency of nib: it pulls a
CUDA build of torch). It takes a seeded random weight, nib's RTN codes and
scales for it, and packs them with GPTQModel's TorchLinear.pack_original (an
independent implementation of the GPTQ format); it stores GPTQModel's qweight,
qzeros (GPTQModel's in-memory "v2" zeros, and the "v1" form its save path
writes), scales, g_idx and GPTQModel's own dequantised weight.
tests/unit/test_gptq_format.py checks that nib reads and writes the same bytes.
"""

from __future__ import annotations

from importlib.metadata import version
from pathlib import Path

import torch
from gptqmodel import QuantizeConfig
from gptqmodel.nn_modules.qlinear.torch import TorchLinear
from gptqmodel.utils.model import convert_gptq_v2_to_v1_format_module
from safetensors.torch import save_file

from nib.engine.quant.rtn import rtn_quantize

OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "gptqmodel-golden.safetensors"


def main() -> None:
    n, k = 64, 384
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(1234)) * 0.02
    q = rtn_quantize(w)
    dense = q.dequantize(torch.float32)
    linear = torch.nn.Linear(k, n, bias=False)
    linear.weight.data = dense
    g_idx = torch.arange(k, dtype=torch.int32) // 128
    module = TorchLinear(
        bits=4, group_size=128, sym=True, desc_act=False, in_features=k, out_features=n, bias=False
    )
    zeros = torch.full((n, k // 128), 8, dtype=torch.int32)
    module.pack_original(linear, q.scales.t().float(), zeros, g_idx)
    module.post_init()
    v2 = module.qzeros.clone()
    dequantized = module.dequantize_weight().t().float().contiguous()
    # GPTQModel's own conversion to the "v1" zeros its checkpoints carry on disk.
    qc = QuantizeConfig(bits=4, group_size=128, sym=True, desc_act=False)
    convert_gptq_v2_to_v1_format_module(module, qc)
    save_file(
        {
            "codes": q.codes,
            "qweight": module.qweight.contiguous(),
            "qzeros_v2": v2.contiguous(),
            "qzeros_v1": module.qzeros.contiguous(),
            "scales": module.scales.contiguous(),
            "g_idx": module.g_idx.to(torch.int32).contiguous(),
            "dequantized": dequantized,
        },
        str(OUT),
        metadata={"made_by": f"gptqmodel {version('gptqmodel')} TorchLinear.pack_original"},
    )
    print(OUT)


if __name__ == "__main__":
    main()
