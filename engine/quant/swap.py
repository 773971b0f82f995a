"""The quantisation seam: swap a loaded model's nn.Linear modules for Int4Linear.

The model code never branches on the weight format; this walks the module tree
once after loading, checks every shape first (so a model is converted whole or
not at all) and replaces each linear. A tied lm_head (`output` sharing the
embedding's weight) gets its own quantised copy: the embedding lookup keeps
reading the 16-bit table.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from nib.engine.quant.format import GROUP_SIZE, Int4Weight, check_shape
from nib.engine.quant.linear import Int4Linear
from nib.engine.quant.rtn import rtn_quantize

Quantizer = Callable[[torch.Tensor, str], Int4Weight]


def linear_names(model: nn.Module) -> list[str]:
    return [name for name, m in model.named_modules() if isinstance(m, nn.Linear)]


def quantize_model(
    model: nn.Module,
    quantizer: Quantizer = rtn_quantize,
    *,
    method: str = "rtn",
    skip: Callable[[str], bool] = lambda name: False,
) -> nn.Module:
    """Replace every nn.Linear (except those `skip` names) by an Int4Linear, in place."""
    names = [n for n in linear_names(model) if not skip(n)]
    for name in names:
        linear = model.get_submodule(name)
        assert isinstance(linear, nn.Linear)
        check_shape(name, linear.out_features, linear.in_features)
    for name in names:
        linear = model.get_submodule(name)
        assert isinstance(linear, nn.Linear)
        device = linear.weight.device
        weight = quantizer(linear.weight.detach(), name)
        module = Int4Linear(weight, linear.bias, name).to(device)
        module.method = method
        model.set_submodule(name, module)
    return model


def describe(model: nn.Module) -> str:
    """What model-info reports: 'none', or e.g. 'int4-g128-gptq+rtn' (methods in use)."""
    methods = sorted({m.method for m in model.modules() if isinstance(m, Int4Linear)})
    if not methods:
        return "none"
    return f"int4-g{GROUP_SIZE}-" + "+".join(methods)
