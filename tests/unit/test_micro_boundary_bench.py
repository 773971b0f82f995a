"""bench/micro_boundary.py's whole-step phases read what bench/decode.py says a decode step
reads: every linear and the K/V rows, less the norms' weights and the embedding row
(which no probe phase models), for both shapes, both weight formats and both contexts."""

from __future__ import annotations

import pytest

from tests.bench_modules import load_bench

pytest.importorskip("torch")


@pytest.mark.parametrize("fmt", ["int4", "bf16"])
@pytest.mark.parametrize("context", [640, 4096])
@pytest.mark.parametrize("shape", ["llama-2-7b", "qwen2.5-coder-1.5b"])
def test_a_steps_phases_read_the_decode_benchs_bytes(shape: str, context: int, fmt: str) -> None:
    from nib.engine.config import ModelConfig

    mb, decode = load_bench("micro_boundary"), load_bench("decode")
    name = f"{shape}-{fmt}" + ("-4k" if context == 4096 else "")
    labels, sizes = mb.step_phases(name)
    cfg = ModelConfig.from_hf(dict(decode.SHAPES[shape]))
    assert len(sizes) == len(labels) == 5 * cfg.num_layers + 1
    assert labels[:5] == ["qkv", "attention", "o_proj", "gate_up", "down"]
    assert labels[-1] == "lm_head"
    per_weight = 0.5 + 2 / 128 if fmt == "int4" else 2.0
    expected = decode.bytes_per_token(cfg, context, per_weight)
    unmodelled = (2 * cfg.num_layers + 1) * cfg.hidden_size * 2 + cfg.hidden_size * 2
    assert sum(sizes) == expected - unmodelled


def test_the_ring_reference_by_hand() -> None:
    """expected_ring (what probe_ring and probe_phases are checked against) on four
    16-byte vectors: a block's phase sum is the low bits of words 0 and 3 of its vectors,
    plus the next block's sum of the phase before."""
    import torch

    mb = load_bench("micro_boundary")
    vecs = [[1, 0, 0, 1], [3, 9, 9, 2], [0, 7, 7, 5], [2, 1, 1, 1]]  # words 0 and 3: bits
    pool = torch.tensor(vecs, dtype=torch.int32).view(-1)
    out = mb.expected_ring(pool, 2, [1, 1], [0, 2])
    # phase 0: block 0 reads vector 0 (1 + 1), block 1 vector 1 (1 + 0)
    # phase 1: block 0 vector 2 (0 + 1) + block 1's 1; block 1 vector 3 (0 + 1) + block 0's 2
    assert out.tolist() == [[2.0, 1.0], [2.0, 3.0]]
    assert mb.expected_phases(pool, 2, 1, 2, 2, 4).tolist() == out.tolist()
