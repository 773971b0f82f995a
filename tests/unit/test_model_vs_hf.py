"""nib's model equals Hugging Face transformers on the same random weights (fp32, CPU)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from nib.engine.loader import CheckpointError, load_model

from .hf_models import SHAPES, save_hf_model

pytest.importorskip("transformers")


@pytest.fixture(scope="module", params=sorted(SHAPES))
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp(request.param)
    hf = save_hf_model(request.param, out)
    ours = load_model(out)
    ours.setup_cache(256)
    return hf, ours


def test_prefill_logits_match(pair) -> None:
    hf, ours = pair
    ids = torch.randint(0, 384, (1, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(ids).logits
        out = ours(ids, torch.arange(40), 40)
    assert ref.abs().max() > 0.1, "degenerate logits would hide a wrong mapping"
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-4)


def test_decode_steps_match_full_forward(pair) -> None:
    """Prefill then one token at a time through the static cache = one full forward."""
    hf, ours = pair
    ids = torch.randint(0, 384, (1, 24), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = hf(ids).logits[0]
        ours(ids[:, :16], torch.arange(16), 16)
        steps = [ours(ids[:, i : i + 1], torch.tensor([i]), i + 1)[0, 0] for i in range(16, 24)]
    torch.testing.assert_close(torch.stack(steps), ref[16:], atol=2e-5, rtol=1e-4)


def test_greedy_tokens_match_hf_generate(pair) -> None:
    hf, ours = pair
    prompt = torch.randint(0, 384, (1, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref = hf.generate(prompt, max_new_tokens=32, do_sample=False, min_new_tokens=32)[0, 12:]
        tokens = []
        logits = ours(prompt, torch.arange(12), 12)[0, -1]
        for pos in range(12, 12 + 32):
            token = int(logits.argmax())
            tokens.append(token)
            logits = ours(torch.tensor([[token]]), torch.tensor([pos]), pos + 1)[0, -1]
    assert tokens == ref.tolist()


def test_missing_tensor_is_named(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    save_hf_model("llama-tied-gqa", tmp_path)
    state = load_file(str(tmp_path / "model.safetensors"))
    del state["model.layers.1.mlp.up_proj.weight"]
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"model\.layers\.1\.mlp\.up_proj\.weight"):
        load_model(tmp_path)


def test_wrong_shape_is_named(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    save_hf_model("qwen2-bias-untied", tmp_path)
    state = load_file(str(tmp_path / "model.safetensors"))
    state["model.layers.0.self_attn.o_proj.weight"] = torch.zeros(64, 128)
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"o_proj\.weight has shape"):
        load_model(tmp_path)
