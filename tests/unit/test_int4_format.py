"""INT4 format, kernel layout, CPU reference, RTN and the module swap."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nib.engine.loader import load_model
from nib.engine.quant.format import GROUP_SIZE, Int4Weight, QuantShapeError, check_shape
from nib.engine.quant.layout import pack, unpack
from nib.engine.quant.linear import Int4Linear
from nib.engine.quant.reference import int4_linear_reference
from nib.engine.quant.rtn import rtn_quantize
from nib.engine.quant.swap import describe, quantize_model


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 6), kw=st.integers(1, 5), seed=st.integers(0, 2**31 - 1))
def test_pack_unpack_round_trip(n: int, kw: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (n * 8, kw * 8), generator=g, dtype=torch.uint8)
    packed = pack(codes)
    assert packed.dtype == torch.int32 and packed.shape == (n * 8, kw)
    assert torch.equal(unpack(packed), codes)


def test_layout_puts_adjacent_inputs_in_the_two_halves_of_a_word() -> None:
    codes = torch.arange(8, dtype=torch.uint8).view(1, 8)  # input k holds code k
    word = int(pack(codes)[0, 0]) & 0xFFFFFFFF
    assert word & 0x000F000F == (0 | 1 << 16)  # inputs 0 and 1
    assert (word >> 4) & 0x000F000F == (2 | 3 << 16)
    assert (word >> 8) & 0x000F000F == (4 | 5 << 16)
    assert (word >> 12) & 0x000F000F == (6 | 7 << 16)


def test_rtn_error_is_at_most_half_a_step_inside_the_range() -> None:
    w = torch.randn(64, 4 * GROUP_SIZE, generator=torch.Generator().manual_seed(0))
    q = rtn_quantize(w)
    assert q.codes.max() <= 15 and q.scales.dtype == torch.float16
    step = q.scales.float().t().repeat_interleave(GROUP_SIZE, dim=1)
    err = (w - q.dequantize()).abs()
    inside = w.abs() <= 7 * step  # +8 steps is clipped to +7 (symmetric GPTQ convention)
    assert bool((err[inside] <= step[inside] / 2 + 1e-6).all())
    assert bool((err <= step + 1e-6).all())


def test_reference_matmul_equals_dense_matmul_of_the_dequantised_weight() -> None:
    g = torch.Generator().manual_seed(1)
    w, x, b = (
        torch.randn(40, 256, generator=g),
        torch.randn(3, 5, 256, generator=g),
        torch.randn(40),
    )
    q = rtn_quantize(w)
    out = int4_linear_reference(x, pack(q.codes), q.scales, b)
    torch.testing.assert_close(out, x @ q.dequantize().t() + b, rtol=1e-5, atol=1e-5)
    assert out.shape == (3, 5, 40)


@pytest.mark.parametrize(
    ("n", "k", "rule"), [(64, 200, "K % 128"), (60, 256, "N % 8"), (0, 0, None)]
)
def test_shapes_are_checked_naming_layer_and_rule(n: int, k: int, rule: str | None) -> None:
    if rule is None:
        check_shape("ok", 64, 256)
        return
    with pytest.raises(QuantShapeError, match=rf"layers\.3\.attention\.wo.*{rule}"):
        check_shape("layers.3.attention.wo", n, k)


def test_int4_weight_rejects_scales_that_do_not_fit() -> None:
    with pytest.raises(ValueError, match="do not fit"):
        Int4Weight(torch.zeros(8, 256, dtype=torch.uint8), torch.ones(3, 8, dtype=torch.float16))


def test_swap_quantises_every_linear_and_keeps_the_tied_embedding(random_model_dir: Path) -> None:
    dense = load_model(random_model_dir)
    model = load_model(random_model_dir, quant="int4")
    assert describe(dense) == "none" and describe(model) == "int4-g128-rtn"
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert linears == []
    assert isinstance(model.output, Int4Linear)
    # The embedding lookup still reads the 16-bit table, unchanged.
    assert torch.equal(model.tok_embeddings.weight, dense.tok_embeddings.weight)
    # The lm_head is the RTN of that table.
    expected = rtn_quantize(dense.tok_embeddings.weight.detach())
    assert torch.equal(model.output.int4_weight().codes, expected.codes)


def test_swap_refuses_a_model_with_an_unrunnable_layer_before_changing_anything() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(256, 64), torch.nn.Linear(64, 64))
    with pytest.raises(QuantShapeError, match=r"^1: in_features 64"):
        quantize_model(model)
    assert isinstance(model[0], torch.nn.Linear)  # nothing was swapped


def test_int4_model_logits_track_the_16bit_model(random_model_dir: Path) -> None:
    dense = load_model(random_model_dir)
    model = load_model(random_model_dir, quant="int4")
    ids = torch.randint(0, 256, (1, 24), generator=torch.Generator().manual_seed(0))
    outs = []
    for m in (dense, model):
        m.setup_cache(32)
        with torch.inference_mode():
            outs.append(m(ids, torch.arange(24), 24))
    # Same model up to 4-bit weight noise: close, but not identical.
    rel = float((outs[0] - outs[1]).norm() / outs[0].norm())
    assert 0 < rel < 0.5
