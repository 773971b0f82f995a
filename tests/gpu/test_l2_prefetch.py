"""The L2 prefetch chain on the GPU (engine/cuda/prefetch.py): a hint that changes no
bit. Each kernel with prefetch ranges (and its weight stream evict-first) against the
same call without, on fresh random inputs with the outputs poisoned first; then whole
engines, 16-bit and INT4, with and without the chain, token for token."""

from __future__ import annotations

import queue
import random
from pathlib import Path

import pytest
import torch

from nib.engine.cuda import gemv16, prefetch
from nib.engine.cuda.gemv16 import EPI_PLAIN, EPI_RESIDUAL, Gemv16Config
from nib.engine.cuda.w4a16 import EPI_GLU, CudaInt4, W4Config
from nib.engine.cuda.w4a16 import EPI_PLAIN as W4_PLAIN

from .models import save_random_hf_model

pytestmark = pytest.mark.gpu

DEVICE = torch.device("cuda")
SEED = random.randrange(1 << 30)


def _kernels_or_skip() -> None:
    from nib.engine.cuda.loader import unavailable_reason

    if why := unavailable_reason(DEVICE):
        pytest.skip(why)
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("L2 bulk prefetch needs sm_90")


def _elsewhere(mb: int) -> tuple[torch.Tensor, prefetch.PrefetchArgs]:
    """Another weight-sized buffer and a prefetch of all of it (four ranges)."""
    other = torch.randn(mb * 2**20 // 2, device=DEVICE, dtype=torch.bfloat16)
    q = other.numel() * 2 // 4 // 256 * 256
    base = other.data_ptr()
    return other, prefetch.make([(base + i * q, q) for i in range(4)], evict_first=True)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "cfg", [Gemv16Config(2, 4, 4), Gemv16Config(1, 4, 8, split_k=4), Gemv16Config(2, 8, 4)]
)
@pytest.mark.parametrize("mode", ["plain", "norm", "residual", "glu"])
def test_gemv16_with_prefetch_equals_without(
    dtype: torch.dtype, cfg: Gemv16Config, mode: str
) -> None:
    _kernels_or_skip()
    g = torch.Generator(device="cuda").manual_seed(SEED)
    n, k = 1536, 8960
    glu = mode == "glu"
    w = (torch.randn(2 * n if glu else n, k, generator=g, device=DEVICE) * 0.02).to(dtype)
    x = torch.randn(k, generator=g, device=DEVICE).to(dtype)
    nw = (
        (1 + 0.1 * torch.randn(k, generator=g, device=DEVICE)).to(dtype)
        if mode != "plain"
        else None
    )
    if mode == "residual":
        nw = None
    res0 = torch.randn(n, generator=g, device=DEVICE).to(dtype)
    other, pf = _elsewhere(32)
    outs = []
    for args in (None, pf, prefetch.NONE, pf):
        out = (
            res0.clone()
            if mode == "residual"
            else torch.full((n,), float("nan"), device=DEVICE, dtype=dtype)
        )
        gemv16.launch(
            x, w, None, out, n, cfg, nw, 1e-6, EPI_RESIDUAL if mode == "residual" else EPI_PLAIN,
            glu=glu, prefetch=args,
        )  # fmt: skip
        outs.append(out)
    torch.cuda.synchronize()
    assert not outs[0].isnan().any(), f"seed {SEED}: unwritten outputs"
    for o in outs[1:]:
        assert torch.equal(o, outs[0]), f"seed {SEED}: {cfg.label()} {mode} changed by prefetch"
    ref = gemv16.reference(x, w, None, nw, 1e-6, glu, res0 if mode == "residual" else None)
    err = (outs[0].double() - ref.double()).abs().max() / ref.double().abs().max()
    assert err < 1e-2, f"seed {SEED}: {err}"
    del other


@pytest.mark.parametrize(
    "cfg",
    [W4Config(1, 4, 4, 1), W4Config(2, 4, 2, 4), W4Config(2, 4, 3, 1, bulk=True)],
    ids=lambda c: c.label(),
)
@pytest.mark.parametrize("fusion", ["", "norm", "norm_glu"])
@pytest.mark.parametrize("m", [1, 5])
def test_w4a16_with_prefetch_equals_without(cfg: W4Config, fusion: str, m: int) -> None:
    _kernels_or_skip()
    if m > 1 and fusion:
        pytest.skip("the fused glue runs at one row only")
    g = torch.Generator(device="cuda").manual_seed(SEED)
    n, k = 4096, 4096
    codes = torch.randint(0, 16, (n, k), generator=g, device=DEVICE, dtype=torch.uint8)
    scales = (torch.rand(k // 128, n, generator=g, device=DEVICE) * 0.02 + 0.001).half()
    p = CudaInt4(codes, scales, None, fusion, "prefetch", torch.float16)
    p.prepare(cfg, m)
    x = torch.randn(m, k, generator=g, device=DEVICE).half()
    nw = (1 + 0.1 * torch.randn(k, generator=g, device=DEVICE)).half() if fusion else None
    epi = EPI_GLU if fusion == "norm_glu" else W4_PLAIN
    n_out = n // 2 if fusion == "norm_glu" else n
    other, pf = _elsewhere(32)
    outs = []
    for args in (prefetch.NONE, pf, prefetch.NONE, pf):
        p.prefetch = args
        y = torch.full((m, n_out), float("nan"), device=DEVICE, dtype=torch.float16)
        p.run(x if m > 1 else x.view(-1), y if m > 1 else y.view(-1), m, cfg, epi, nw, 1e-6)
        outs.append(y)
    torch.cuda.synchronize()
    assert not outs[0].isnan().any(), f"seed {SEED}: unwritten outputs"
    for o in outs[1:]:
        assert torch.equal(o, outs[0]), f"seed {SEED}: {cfg.label()} {fusion} changed by prefetch"
    del other


def test_chain_links_every_layer_of_a_model_in_call_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _kernels_or_skip()
    from nib.engine.engine import Engine, EngineConfig

    monkeypatch.setenv("NIB_L2_PREFETCH_MB", "16")  # pinned: step tuning leaves it on

    model_dir = save_random_hf_model("qwen2", tmp_path / "m", layers=3)
    engine = Engine(EngineConfig(model_dir=model_dir, device="cuda", max_context=512)).start()
    try:
        assert engine.wait_ready(300), engine.failure
        order = prefetch.decode_order(engine.model)
        chain = [prefetch.weight_ranges(m) for m in order]
        for i, module in enumerate(order):
            args = getattr(module, "prefetch", None)
            assert args is not None, f"layer {i} has no prefetch"
            got = args.ranges()
            assert got, f"layer {i} prefetches nothing"
            assert got[0] == chain[(i + 1) % len(chain)][0], f"layer {i}: not its successor first"
    finally:
        engine.stop()


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("quant", ["none", "int4"])
def test_engines_with_and_without_prefetch_give_the_same_tokens(
    arch: str, quant: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _kernels_or_skip()
    from nib.engine.engine import Engine, EngineConfig
    from nib.engine.quant.linear import Int4Linear
    from nib.engine.request import DoneEvent, GenerationParams, TokenEvent

    model_dir = save_random_hf_model(arch, tmp_path / arch)
    prompt = list(b"def fibonacci(n):\n    if n < 2:\n        return n\n") * 3
    runs = []
    for mb in ("0", "64"):
        monkeypatch.setenv("NIB_L2_PREFETCH_MB", mb)
        config = EngineConfig(
            model_dir=model_dir, device="cuda", max_context=1024, quant=quant, tune_kernels=False
        )
        engine = Engine(config).start()
        try:
            assert engine.wait_ready(300), engine.failure
            targets = [
                m.cuda if isinstance(m, Int4Linear) else m
                for m in prefetch.decode_order(engine.model)
            ]
            has = [bool(getattr(t, "prefetch", prefetch.NONE).ranges()) for t in targets]
            assert any(has) == (mb != "0"), (mb, has)
            events: queue.Queue = queue.Queue()
            engine.submit(prompt, GenerationParams(max_tokens=64), events.put, "t")
            tokens: list[int] = []
            while not isinstance(ev := events.get(timeout=120), DoneEvent):
                assert isinstance(ev, TokenEvent)
                tokens.extend(ev.token_ids)
            assert len(tokens) == 64
            runs.append(tokens)
        finally:
            engine.stop()
    assert runs[0] == runs[1]
