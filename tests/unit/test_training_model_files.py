"""Model shape rules, the learning-rate schedule, shards, packing and the perplexity definition."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest
import torch

from training.checkpoint import save_model, shard_plan
from training.evaluate import stream_loss
from training.package import MIB, TAR_NAME, PackageError, check_limits, pack, unpack
from training.shapes import H200, TINY, ModelShape, ShapeError
from training.trainer import TrainConfig, build_model, lr_at


def test_shipped_shape_arithmetic() -> None:
    # embeddings 8192*384 + 8 layers * (q,k,v,o 2*147456 + 2*49152, MLP 3*393216, norms 768) + norm
    assert H200.num_parameters() == 3_145_728 + 8 * 1_573_632 + 384 == 15_735_168
    assert H200.weight_bytes() / MIB == pytest.approx(30.01, abs=0.01)
    H200.validate()
    TINY.validate()
    model = build_model(TINY, 0, torch.device("cpu"), 0)
    assert sum(p.numel() for p in model.parameters()) == TINY.num_parameters()
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            assert module.in_features % 128 == 0 and module.out_features % 128 == 0, name
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_shape_rules_name_the_layer() -> None:
    with pytest.raises(ShapeError, match=r"self_attn.k_proj is 384 -> 64"):
        ModelShape(num_kv_heads=1).validate()
    with pytest.raises(ShapeError, match="at most 32 MiB"):
        ModelShape(num_layers=12).validate()


def test_lr_warms_up_then_decays_to_the_floor() -> None:
    cfg = TrainConfig(lr=1e-3, warmup_fraction=0.1, min_lr_ratio=0.1)
    lrs = [lr_at(s, 100, cfg) for s in range(100)]
    assert lrs[0] == pytest.approx(1e-4) and lrs[9] == pytest.approx(1e-3)
    assert all(a >= b for a, b in itertools.pairwise(lrs[9:]))
    assert lrs[-1] == pytest.approx(1e-4, rel=0.01)


def test_shard_plan_respects_the_cap() -> None:
    plan = shard_plan([("a", 6), ("b", 5), ("c", 4), ("d", 10)], 10)
    assert plan == [["a"], ["b", "c"], ["d"]]
    with pytest.raises(ValueError, match="more than a whole shard"):
        shard_plan([("huge", 11)], 10)


def test_saved_shards_load_in_transformers_and_nib(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    from nib.engine.loader import load_model

    model = build_model(TINY, 0, torch.device("cpu"), 3)
    shards = save_model(model, tmp_path, max_shard_bytes=300_000)
    assert len(shards) > 1
    assert all(p.stat().st_size <= 300_000 + 4096 for p in shards)  # + safetensors header
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert "lm_head.weight" not in index["weight_map"]
    hf, info = AutoModelForCausalLM.from_pretrained(
        tmp_path, dtype=torch.float32, output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"]
    ours = load_model(tmp_path)
    ours.setup_cache(64)
    ids = torch.randint(0, TINY.vocab_size, (1, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = hf(ids).logits
        out = ours(ids, torch.arange(40), 40)
    assert ref.abs().max() > 0.01
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)


def test_pack_and_unpack_check_sums_and_sizes(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "model-00001-of-00001.safetensors").write_bytes(b"\0" * 1000)
    out = tmp_path / "out"
    written = pack(folder, out)
    assert sorted(p.name for p in written) == sorted(["model-00001-of-00001.safetensors", TAR_NAME])
    dest = tmp_path / "installed"
    files = unpack(out, dest)
    assert sorted(p.name for p in files) == [
        "SHA256SUMS",
        "config.json",
        "model-00001-of-00001.safetensors",
    ]
    with pytest.raises(PackageError, match="exists"):
        unpack(out, dest)
    (out / "model-00001-of-00001.safetensors").write_bytes(b"\1" * 1000)  # corrupted in transit
    with pytest.raises(PackageError, match="sha256 does not match"):
        unpack(out, dest, force=True)
    (folder / "big.bin").write_bytes(b"\0" * (16 * MIB))
    with pytest.raises(PackageError, match="under 16 MiB"):
        check_limits(folder)


def test_stream_loss_counts_every_token_but_the_first() -> None:
    vocab = 11
    table = torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(0))
    ids = torch.randint(0, vocab, (95,), generator=torch.Generator().manual_seed(1))
    lengths = list(range(vocab))
    report = stream_loss(lambda x: table[x], ids, window=20, byte_lengths=lengths, batch_size=3)
    logp = torch.log_softmax(table, -1)
    starts = range(0, 94, 20)
    nats = -sum(float(logp[ids[i], ids[i + 1]]) for s in starts for i in range(s, min(s + 20, 94)))
    assert report.tokens == 94
    assert report.nats == pytest.approx(nats, rel=1e-5)
    assert report.bytes == sum(lengths[int(t)] for t in ids[1:])
    assert report.perplexity == pytest.approx(math.exp(nats / 94), rel=1e-5)
    assert report.bits_per_byte == pytest.approx(nats / math.log(2) / report.bytes, rel=1e-5)
