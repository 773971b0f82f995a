"""The decode graph's embedding kernel (engine/cuda/embed.cu) checked on the CPU.

- it compiles for sm_90 and sm_80 without spills or a stack frame (skipped, with the
  reason, where nvcc is missing), and lets the next kernel launch before it waits;
- the wrapper takes what the kernel can and rejects the rest, naming the rule;
- the self-check's case demands an exact copy;
- the kernel paths name it for the decode graphs (tests/unit/test_versions_and_paths.py).
The kernel itself runs in tests/gpu/test_cuda_embed.py.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch

from nib.engine.cuda import build
from nib.engine.cuda.embed import (
    MAX_ROWS,
    THREADS,
    blocks_for,
    check_table,
    check_tokens,
)
from tests.unit.cuda_tools import nvcc_or_skip

SOURCE = Path(build.HERE) / "embed.cu"


@pytest.mark.parametrize("target", ["sm_90", "sm_80"])
def test_the_kernel_compiles_without_spills(target: str) -> None:
    nvcc_or_skip()
    (report,) = build.resources("embed.cu", target)
    assert report.kernel == "embed_rows"
    assert report.spill_stores == 0 and report.spill_loads == 0 and report.stack_bytes == 0
    assert report.registers <= 32, report


def test_the_next_kernel_may_launch_before_this_one_waits() -> None:
    text = re.sub(r"//.*", "", SOURCE.read_text())
    assert text.index("pdl_launch_dependents()") < text.index("pdl_wait()")
    assert text.index("pdl_wait()") < text.index("a.tokens[r]")  # tokens only after the wait
    assert f"constexpr int THREADS = {THREADS};" in text


def test_blocks_cover_a_row_with_one_vector_a_thread() -> None:
    assert blocks_for(4096, 2) == 2  # Llama-2-7B bf16: 512 vectors
    assert blocks_for(1536, 2) == 1  # Qwen2.5-1.5B: 192
    assert blocks_for(8, 2) == 1


def test_the_wrapper_names_the_rule() -> None:
    check_table(torch.zeros(10, 64, dtype=torch.bfloat16))
    check_table(torch.zeros(10, 8, dtype=torch.float16))
    with pytest.raises(ValueError, match="fp16 or bf16"):
        check_table(torch.zeros(10, 64))
    with pytest.raises(ValueError, match=r"contiguous \[vocab, hidden\]"):
        check_table(torch.zeros(64, 10, dtype=torch.bfloat16).t())
    with pytest.raises(ValueError, match="whole 16-byte vectors"):
        check_table(torch.zeros(10, 12, dtype=torch.bfloat16))
    cpu = torch.device("cpu")
    check_tokens(torch.zeros(1, 1, dtype=torch.int64), cpu)
    with pytest.raises(ValueError, match="contiguous int64"):
        check_tokens(torch.zeros(1, 1, dtype=torch.int32), cpu)
    with pytest.raises(ValueError, match=f"1 to {MAX_ROWS} tokens"):
        check_tokens(torch.zeros(0, dtype=torch.int64), cpu)
    with pytest.raises(ValueError, match=f"1 to {MAX_ROWS} tokens"):
        check_tokens(torch.zeros(MAX_ROWS + 1, dtype=torch.int64), cpu)


def test_no_kernel_on_the_cpu() -> None:
    from nib.engine.cuda.embed import cuda_embedding

    assert cuda_embedding(torch.zeros(10, 64, dtype=torch.bfloat16)) is None


def test_the_model_takes_an_embedding_override_that_gives_the_same_rows() -> None:
    from nib.engine.config import ModelConfig
    from nib.engine.model import Transformer

    cfg = ModelConfig(
        model_type="llama", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=1,
        num_heads=2, num_kv_heads=2, head_dim=16, rms_norm_eps=1e-6, rope_theta=10000.0,
        max_position_embeddings=64, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    model = Transformer(cfg)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.2)
    model.setup_cache(16)
    seen: list[torch.Tensor] = []

    def embed(tokens: torch.Tensor) -> torch.Tensor:
        seen.append(tokens)
        return torch.nn.functional.embedding(tokens, model.tok_embeddings.weight)

    tokens, pos = torch.tensor([[5, 9]]), torch.arange(2)
    with torch.inference_mode():
        want = model(tokens, pos, kv_len=2)
        got = model(tokens, pos, kv_len=2, embed=embed)
        assert len(seen) == 1 and torch.equal(seen[0], tokens)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        # The override is what the model embeds with: a different lookup, other logits.
        other = model(tokens, pos, kv_len=2, embed=lambda t: embed(t).flip(-1))
    assert not math.isclose(float((other - want).abs().max()), 0.0)
