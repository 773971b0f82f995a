"""GPTQ checkpoints: bytes as GPTQModel writes them, round trips, refusals, the algorithm."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from nib.engine.config import ConfigError
from nib.engine.loader import load_model
from nib.engine.quant.format import GROUP_SIZE, Int4Weight
from nib.engine.quant.gptq import HessianAccumulator, gptq_quantize
from nib.engine.quant.gptq_checkpoint import save_gptq_checkpoint
from nib.engine.quant.gptq_format import GptqConfig, GptqFormatError, from_gptq, to_gptq
from nib.engine.quant.rtn import rtn_quantize
from nib.engine.quant.swap import describe

GOLDEN = Path(__file__).resolve().parent.parent / "data" / "gptqmodel-golden.safetensors"


@pytest.fixture(scope="module")
def golden() -> dict[str, torch.Tensor]:
    with safe_open(str(GOLDEN), "pt") as f:
        assert f.metadata()["made_by"].startswith("gptqmodel ")
    return load_file(str(GOLDEN))


def test_nib_writes_the_bytes_gptqmodel_packs(golden: dict[str, torch.Tensor]) -> None:
    weight = Int4Weight(golden["codes"], golden["scales"])
    v1 = to_gptq(weight, GptqConfig(checkpoint_format="gptq"))
    v2 = to_gptq(weight, GptqConfig(checkpoint_format="gptq_v2"))
    assert torch.equal(v1["qweight"], golden["qweight"])
    assert torch.equal(v1["qzeros"], golden["qzeros_v1"])
    assert torch.equal(v2["qzeros"], golden["qzeros_v2"])
    assert torch.equal(v1["g_idx"], golden["g_idx"])


def test_nib_reads_what_gptqmodel_packs(golden: dict[str, torch.Tensor]) -> None:
    tensors = {k: golden[k] for k in ("qweight", "scales", "g_idx")}
    got = from_gptq("x", {**tensors, "qzeros": golden["qzeros_v1"]}, GptqConfig(), 64)
    assert torch.equal(got.codes, golden["codes"])
    v2 = GptqConfig(checkpoint_format="gptq_v2")
    assert torch.equal(
        from_gptq("x", {**tensors, "qzeros": golden["qzeros_v2"]}, v2, 64).codes, got.codes
    )
    # GPTQModel's own dequantisation (in fp16) of its packed tensors equals ours (in fp32)
    # up to fp16 rounding of the product.
    torch.testing.assert_close(got.dequantize(), golden["dequantized"], rtol=2**-11, atol=1e-7)


def test_act_order_and_asymmetric_layers_are_refused_by_name() -> None:
    q = rtn_quantize(torch.randn(16, 2 * GROUP_SIZE))
    t = to_gptq(q)
    shuffled = {**t, "g_idx": t["g_idx"].flip(0)}
    with pytest.raises(GptqFormatError, match=r"layers\.0\.mlp\.up_proj\.g_idx.*act-order"):
        from_gptq("layers.0.mlp.up_proj", shuffled, GptqConfig(desc_act=True), 16)
    asym = {**t, "qzeros": t["qzeros"] + 1}
    with pytest.raises(GptqFormatError, match=r"up_proj\.qzeros.*sym"):
        from_gptq("up_proj", asym, GptqConfig(), 16)
    with pytest.raises(GptqFormatError, match="group_size=64"):
        GptqConfig(group_size=64).check("ckpt")


def test_gptq_beats_round_to_nearest_on_correlated_inputs() -> None:
    g = torch.Generator().manual_seed(0)
    k, n = 2 * GROUP_SIZE, 32
    mix = torch.randn(k, k, generator=g) / k**0.5
    x = torch.randn(2048, k, generator=g) @ mix + 0.1 * torch.randn(2048, k, generator=g)
    w = torch.randn(n, k, generator=g)
    acc = HessianAccumulator(k)
    for part in x.split(512):
        acc.add(part)
    expected = (2 / len(x)) * (x.double().t() @ x.double())
    torch.testing.assert_close(acc.h, expected, rtol=1e-4, atol=1e-5)  # fp32 products

    def loss(q: Int4Weight) -> float:
        return float(((w - q.dequantize()) @ x.t()).pow(2).sum())

    gptq, rtn = gptq_quantize(w, acc.h), rtn_quantize(w)
    assert loss(gptq) < 0.8 * loss(rtn)


def test_nib_quantize_writes_a_checkpoint_nib_loads_without_requantising(
    random_model_dir: Path, tmp_path: Path
) -> None:
    from nib.sdk.cli import main

    out = tmp_path / "gptq"
    argv = ["quantize", "--model", str(random_model_dir), "--out", str(out)]
    assert main([*argv, "--samples", "4", "--seq-len", "64", "--device", "cpu"]) == 0
    qc = json.loads((out / "quantize_config.json").read_text())
    assert (qc["bits"], qc["group_size"], qc["sym"], qc["desc_act"]) == (4, 128, True, False)
    tensors = load_file(str(out / "model.safetensors"))
    assert tensors["model.layers.0.self_attn.k_proj.qweight"].dtype == torch.int32
    assert "model.layers.0.mlp.gate_proj.qzeros" in tensors  # unfused, HF names
    model = load_model(out)
    assert describe(model) == "int4-g128-gptq"
    # Loading fuses q/k/v again and keeps the exact codes that were written.
    parts = [
        from_gptq(
            p,
            {
                t: tensors[f"model.layers.1.self_attn.{p}.{t}"]
                for t in ("qweight", "qzeros", "scales", "g_idx")
            },
            GptqConfig(),
            0 + tensors[f"model.layers.1.self_attn.{p}.qweight"].shape[1],
        )
        for p in ("q_proj", "k_proj", "v_proj")
    ]
    fused = model.layers[1].attention.wqkv.int4_weight()
    assert torch.equal(fused.codes, Int4Weight.cat(parts).codes)
    with pytest.raises(ConfigError, match="GPTQ INT4 checkpoint"):
        load_model(out, quant="none")


def test_an_act_order_checkpoint_is_refused_at_load(random_model_dir: Path, tmp_path: Path) -> None:
    weights = {}
    model = load_model(random_model_dir)
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Linear) and name.startswith("layers."):
            weights[name] = rtn_quantize(m.weight.detach())
    out = save_gptq_checkpoint(random_model_dir, tmp_path / "ao", weights)
    tensors = load_file(str(out / "model.safetensors"))
    g_idx = tensors["model.layers.0.mlp.down_proj.g_idx"]
    tensors["model.layers.0.mlp.down_proj.g_idx"] = g_idx[torch.randperm(len(g_idx))]
    save_file(tensors, str(out / "model.safetensors"))
    with pytest.raises(
        GptqFormatError, match=r"model\.layers\.0\.mlp\.down_proj\.g_idx.*act-order"
    ):
        load_model(out)
