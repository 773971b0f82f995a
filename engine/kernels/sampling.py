"""Exponential noise for sampling inside a CUDA graph, from a device-side seed.

Sampling uses the exponential race: argmax(p_i / E_i) with E_i ~ Exp(1) picks
token i with probability p_i. The noise is Philox(seed, step * V + i), with
seed and step read from device memory, so a captured graph samples a fresh,
reproducible token on every replay: same seed, same tokens.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _exp_noise_kernel(OUT, SEED, STEP, V, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = i < V
    seed = tl.load(SEED)
    step = tl.load(STEP)
    u = tl.rand(seed, (step * V + i).to(tl.uint32))
    # u is in [0, 1): -log(u) is in (0, inf]; inf makes a token unpickable, which has
    # probability ~2^-32 per token.
    tl.store(OUT + i, -tl.log(u), mask=ok)


def exp_noise(out: torch.Tensor, seed: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
    v = out.numel()
    block = 1024
    _exp_noise_kernel[(triton.cdiv(v, block),)](out, seed, step, v, BLOCK=block, num_warps=4)
    return out
