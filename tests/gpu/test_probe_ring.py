"""engine/cuda/probe.cu's probe_ring (bench/micro_boundary.py --ring) on the GPU.

The persistent ring probe streams every phase's data through a ring of shared-memory
slots while its consumer warps wait at a grid barrier between phases; each output adds a
neighbouring block's output of the previous phase, so a barrier that lets a block
through early, a slot reused before it was consumed or one consumed before its copy
landed gives a wrong sum. The outputs start poisoned (NaN), so every one must be
written. Shapes cover a ring smaller than one phase (slots reused within a phase), a
last chunk shorter than a slot, empty phases and phases of different sizes."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
import torch

from tests.bench_modules import load_bench

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def setup() -> tuple[ModuleType, object, torch.Tensor]:
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("needs an sm_90 GPU (bulk copies)")
    from nib.engine.cuda.loader import module

    mb = load_bench("micro_boundary")
    kernel = module("probe.cu", torch.device("cuda")).kernel("probe_ring")
    gen = torch.Generator(device="cuda").manual_seed(7)
    pool = torch.randint(0, 1 << 30, (16 << 20,), device="cuda", dtype=torch.int32, generator=gen)
    return mb, kernel, pool  # 64 MB of random words


@pytest.mark.parametrize(
    ("sizes", "ring_kb", "chunk_kb"),
    [
        ([1 << 20] * 6, 192, 8),  # one phase fits in the ring
        ([3 << 20] * 5, 16, 8),  # two slots: reused many times within a phase
        ([1_000_000, 0, 4_000_000, 48_016, 0, 2_500_000], 64, 16),  # uneven, empty, short chunks
        ([0] * 4, 32, 8),  # barriers only
    ],
)
def test_every_output_is_the_reference(
    setup, sizes: list[int], ring_kb: int, chunk_kb: int
) -> None:  # type: ignore[no-untyped-def]
    mb, kernel, pool = setup
    blocks = mb.ring_blocks(kernel, ring_kb << 10)
    assert blocks >= torch.cuda.get_device_properties(0).multi_processor_count
    r = mb.time_ring(kernel, pool, blocks, sizes, ring_kb << 10, chunk_kb << 10)
    assert r["correct"], r
    assert r["us_per_launch"] > 0
    assert r["bytes"] == sum((n // 16 // blocks) * 16 * blocks for n in sizes)


def test_the_step_rows_of_the_bench(tmp_path: Path) -> None:
    """`bench/micro_boundary.py --steps` as a user runs it: the chain and the ring over a
    whole INT4 step's bytes, the ring's outputs checked, its trace split by stage; and
    --linears, the probe on each INT4 linear's bytes."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("needs an sm_90 GPU (bulk copies)")
    from tests.gpu.bench_run import run_bench

    args = ["--no-sweep", "--ring", "64", "--ring-modes", ",no-read", "--trace", "--linears"]
    args += ["--steps", "qwen2.5-coder-1.5b-int4", "--chain-blocks", "132"]
    result = run_bench("micro_boundary.py", args, tmp_path, "micro-boundary")
    rows = {r["impl"]: r for r in result["step_rows"]}
    assert set(rows) == {"pdl-chain-132", "ring-64kb", "ring-64kb-no-read"}
    assert rows["ring-64kb"]["correct"] is True
    assert rows["ring-64kb-no-read"]["correct"] is None  # a diagnostic: not checked
    for r in rows.values():
        assert r["us_per_step"] > r["floor_us_per_step"] > 0
    stages = ["qkv", "attention", "o_proj", "gate_up", "down", "lm_head"]
    assert list(rows["ring-64kb"]["trace"]) == stages
    assert all(t["span_us"] > 0 for t in rows["ring-64kb"]["trace"].values())
    linears = {r["layer"]: r for r in result["linear_rows"]}
    assert len(linears) == 10 and "llama-2-7b.gate_up" in linears
    assert all(r["us_best"] > 0 for r in linears.values())
    for shape in ("llama-2-7b", "qwen2.5-coder-1.5b"):  # the four of a layer, not the lm_head
        four = [linears[f"{shape}.{x}"]["us_best"] for x in ("qkv", "o_proj", "gate_up", "down")]
        assert result["linear_layer_us"][shape] == pytest.approx(sum(four))


def test_the_merged_step_rows_of_the_bench(tmp_path: Path) -> None:
    """`--steps --merges --red` as a user runs it, chains only: the merged step's rows,
    each reducing probe checked (every word holds the sum of all blocks' additions)."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("needs an sm_90 GPU (red.add.v4.f32)")
    from tests.gpu.bench_run import run_bench

    args = ["--no-sweep", "--steps", "qwen2.5-coder-1.5b-int4", "--chain-blocks", "132"]
    args += ["--merges", "gate_up+down;qkv+attention,gate_up+down", "--red", "u64,f32"]
    args += ["--red-cluster", "1,8"]
    result = run_bench("micro_boundary.py", args, tmp_path, "micro-boundary")
    rows = {r["impl"]: r for r in result["step_rows"]}
    plain, one, two = "pdl-chain-132", "merge[gate_up+down]", "merge[qkv+attention,gate_up+down]"
    expected = {plain}
    for m in (one, two):
        expected |= {f"{plain}-{m}"}
        expected |= {f"{plain}-{m}-red-{k}{c}" for k in ("u64", "f32") for c in ("", "-c8")}
    assert set(rows) == expected
    for impl, r in rows.items():
        assert r["us_per_step"] > r["floor_us_per_step"] > 0
        if "-red-" in impl:
            assert r["correct"] is True, impl
            assert r["red_words"] * r["red_cluster"] == 1536
    assert rows[f"{plain}-{two}"]["stages"] == ["qkv+attention", "o_proj", "gate_up+down"]
    assert rows[f"{plain}-{one}"]["stages"] == ["qkv", "attention", "o_proj", "gate_up+down"]


@pytest.mark.parametrize("kind", ["u64", "f32"])
@pytest.mark.parametrize(
    ("blocks", "words", "spread"), [(132, 1536, 1), (264, 512, 8), (77, 64, 16)]
)
def test_a_reducing_probe_adds_every_blocks_share(
    kind: str, blocks: int, words: int, spread: int
) -> None:
    """probe_stream_red_*: word w of chunk j ends as the sum of b + 1 over the blocks b with
    b % spread == j, every word of every chunk (the words start at zero, so an unwritten
    one is caught), for a spread that does not divide the grid too."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("needs an sm_90 GPU (red.add.v4.f32)")
    from nib.engine.cuda.loader import module

    mb = load_bench("micro_boundary")
    name, word_bytes = mb.RED_KERNELS[kind]
    kernel = module("probe.cu", torch.device("cuda")).kernel(name)
    assert mb.check_red(kernel, word_bytes, blocks, words, spread)
