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
    assert labels[:5] == ["qkv", "attention", "o_proj", "gate_up", "down"] == list(mb.STAGES)
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


@pytest.mark.parametrize("name", ["llama-2-7b-int4", "qwen2.5-coder-1.5b-bf16-4k"])
@pytest.mark.parametrize(
    "spec", ["gate_up+down", "qkv+attention,gate_up+down", "attention+o_proj+gate_up+down"]
)
def test_merged_phases_keep_the_steps_bytes(name: str, spec: str) -> None:
    """A merged step reads what the step reads, in fewer phases a layer, each group's
    bytes in one phase at the place of its first stage."""
    mb = load_bench("micro_boundary")
    (groups,) = mb.parse_merges(spec)
    labels, sizes = mb.step_phases(name)
    m_labels, m_sizes = mb.merged_phases(name, groups)
    count = mb.LAYERS[name][0]
    saved = sum(len(g) - 1 for g in groups)
    assert len(m_sizes) == len(m_labels) == (5 - saved) * count + 1
    assert sum(m_sizes) == sum(sizes)
    assert m_labels[-1] == "lm_head" and m_sizes[-1] == sizes[-1]
    per_layer = dict(zip(labels[:5], sizes[:5], strict=True))
    for g in groups:
        assert m_sizes[m_labels.index("+".join(g))] == sum(per_layer[s] for s in g)
    assert mb.merge_label(groups) == spec


def test_merge_sets_are_separated_by_semicolons() -> None:
    mb = load_bench("micro_boundary")
    assert mb.parse_merges(" gate_up+down ; qkv+attention,gate_up+down;") == [
        (("gate_up", "down"),),
        (("qkv", "attention"), ("gate_up", "down")),
    ]
    assert mb.parse_merges("") == []


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("down", "is not two or more of"),
        ("gate_up+mlp", "is not two or more of"),
        ("down+gate_up", "must name consecutive stages in order"),
        ("qkv+o_proj", "must name consecutive stages in order"),
        ("qkv+attention,attention+o_proj", "is in two groups"),
    ],
)
def test_bad_merges_are_refused_by_name(spec: str, message: str) -> None:
    mb = load_bench("micro_boundary")
    with pytest.raises(ValueError, match=message):
        mb.parse_merges(spec)


STEP = ["--steps", "llama-2-7b-int4"]
RED = [*STEP, "--merges", "gate_up+down", "--red"]
BAD_ARGS = [
    (["--merges", "gate_up+down"], "--merges needs --steps"),
    ([*STEP, "--merges", "down+qkv"], "must name consecutive"),
    ([*STEP, "--merges", "qkv+attention", "--red", "u64"], "needs a --merges group that holds"),
    ([*RED, "f16"], "--red: 'f16' is not one of u64, f32"),
    ([*RED, "u64", "--red-cluster", "0"], "--red-cluster: integers from 1 to 16"),
    ([*RED, "u64", "--red-cluster", "x"], "--red-cluster: integers from 1 to 16"),
]


@pytest.mark.parametrize(("argv", "msg"), BAD_ARGS)
def test_bad_arguments_are_refused_before_any_gpu_work(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv: list[str], msg: str
) -> None:
    import sys

    mb = load_bench("micro_boundary")
    monkeypatch.setattr(sys, "argv", ["micro_boundary.py", *argv])
    with pytest.raises(SystemExit) as exc:
        mb.main()
    assert exc.value.code == 2
    assert msg in capsys.readouterr().err


def test_the_reduction_reference_by_hand() -> None:
    """red_reference (what the reducing probes are checked against): 5 blocks over a spread
    of 2 leave 1 + 3 + 5 in the first chunk's words and 2 + 4 in the second's."""
    mb = load_bench("micro_boundary")
    assert mb.red_reference(5, 3, 2).tolist() == [[9.0] * 3, [6.0] * 3]
    assert mb.red_reference(4, 2, 1).tolist() == [[10.0, 10.0]]
