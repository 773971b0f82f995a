"""The fused attention + INT4 o_proj (engine/cuda/attention_oproj.py) without a GPU: the
shapes it takes and the rule it names for the rest, the summation order it follows,
its shared memory, and the model seam that falls back to the two launches. The kernel
itself: tests/gpu/test_cuda_attention_oproj.py (bit for bit against the two launches)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from nib.engine.cuda import attention as fused
from nib.engine.cuda.attention_oproj import (
    MAX_BLOCKS,
    PAIRS_PER_WARP,
    WARPS,
    oproj_for_model,
    order_warps,
    tiles_per_block,
)
from nib.engine.cuda.w4a16 import W4Config


@pytest.mark.parametrize(
    "shape,tiles",
    [
        ((12, 2, 128, 1536, 8), 6),  # Qwen2.5-Coder-1.5B: a cluster of 16, 6 x 12 pairs
        ((8, 2, 64, 512, 8), 2),  # the random Qwen2 test model
        ((7, 1, 128, 896, 8), 7),  # one KV head: a portable cluster of 8, 7 x 7 pairs
        ((16, 4, 64, 1024, 4), 4),
        ((8, 8, 128, 1024, 2), 4),  # bench/step_timeline.py's tiny-llama
    ],
)
def test_shapes_it_takes(shape: tuple[int, ...], tiles: int) -> None:
    assert tiles_per_block(*shape) == (tiles, "")
    h, kvh, d, _, splits = shape
    assert tiles * (h * d // 128) <= WARPS * PAIRS_PER_WARP
    assert splits * kvh <= MAX_BLOCKS


@pytest.mark.parametrize(
    "shape,rule",
    [
        ((32, 32, 128, 4096, 1), "cluster of at most 16"),  # Llama-2-7B's 32 KV heads
        ((12, 2, 128, 1536, 9), "1..8 splits"),
        ((12, 2, 128, 1552, 8), "does not split"),
        ((16, 16, 128, 8192, 1), "pairs its warps hold"),  # 32 tiles x 16 groups
        ((6, 2, 96, 576, 8), "head_dim 96"),
        ((3, 1, 64, 768, 8), "not a multiple of 128"),  # o_proj in_features 192
    ],
)
def test_shapes_it_refuses_name_the_rule(shape: tuple[int, ...], rule: str) -> None:
    tiles, why = tiles_per_block(*shape)
    assert tiles == 0 and rule in why


def test_shared_memory_fits_an_sm90_block() -> None:
    # The attention's (with a merge slot per split) plus the fp16 output row.
    most = fused.shared_bytes(128, WARPS, fused.MAX_CLUSTER) + 12 * 128 * 2
    assert most <= 227 * 1024


def test_it_follows_the_order_of_the_gemv_config_where_that_runs_unsplit() -> None:
    def packed(cfg: W4Config) -> SimpleNamespace:
        return SimpleNamespace(one_row=cfg, effective=lambda c, m: c)

    assert order_warps(packed(W4Config(1, 16, 4))) == 16
    assert order_warps(packed(W4Config(1, 4, 4))) == 4
    assert order_warps(packed(W4Config(1, 8, 4, 2))) == WARPS  # split along K: no match


def test_no_fused_kernel_without_cuda_int4_o_projs() -> None:
    args = (12, 2, 128, 1536, 1024, torch.float16, torch.device("cpu"))
    model, why = oproj_for_model(*args, [None])
    assert model is None and "not nib's CUDA INT4" in why
    model, why = oproj_for_model(*args, [object()])
    assert model is None and "unavailable" in why


def test_the_model_takes_the_two_launches_where_the_fused_one_declines() -> None:
    """Attention.attend_out: rope_attend_out saying False (a layer's o_proj it cannot run)
    leaves heads() and then wo's own call, exactly as without the hook."""
    from nib.engine.config import ModelConfig
    from nib.engine.model import Transformer
    from nib.engine.ops import eager_attention

    cfg = ModelConfig(
        model_type="llama", vocab_size=64, hidden_size=64, intermediate_size=128,
        num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, rms_norm_eps=1e-6,
        rope_theta=10000.0, max_position_embeddings=64, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    model = Transformer(cfg)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.2)
    model.setup_cache(32)
    calls: list[int] = []

    def declining(*args: object) -> bool:
        calls.append(1)
        return False

    def attend(q, cache, pos, kv_len):  # type: ignore[no-untyped-def]
        return eager_attention(q, cache, pos, kv_len)

    attend.rope_attend_out = declining  # type: ignore[attr-defined]
    tokens = torch.tensor([[3, 5, 7]])
    model(tokens, torch.arange(3))
    plain = model(torch.tensor([[11]]), torch.tensor([3]))
    model.setup_cache(32)
    model(tokens, torch.arange(3), attend=attend)
    hooked = model(torch.tensor([[11]]), torch.tensor([3]), attend=attend)
    assert torch.equal(plain, hooked)
    assert len(calls) == cfg.num_layers  # asked once a layer, for the one-token step only
