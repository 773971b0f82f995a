"""The CUDA 16-bit GEMV (engine/cuda/gemv16.cu) on the GPU against a float64 reference.

Every config start-up may choose (gemv16.candidates) plus a few odd ones, on the
layer shapes of Llama-2-7B and Qwen2.5-Coder-1.5B and odd small shapes, bf16 and
fp16, with each fusion the decoder uses (plain + bias, RMSNorm before, residual
add after, SiLU(gate) * up): fresh random inputs each run (the seed is in the
failure message), outputs poisoned with NaN and checked fully written, against
gemv16.reference (float64 sums, the Triton kernel's rounding points). Then: the
same calls captured in a CUDA graph and replayed on new inputs, repeated split-K
launches (the counters must reset), and a whole model on the CUDA configs
through GemvLinear and the start-up self-check's linear cases.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from nib.engine.cuda import gemv16
from nib.engine.cuda.gemv16 import EPI_PLAIN, EPI_RESIDUAL, Gemv16Config

pytestmark = pytest.mark.gpu

DEVICE = torch.device("cuda")
SEED = random.randrange(1 << 30)

SHAPES = {  # (out N, in K); gate_up: N = 2 x intermediate
    "llama-2-7b.qkv": (12288, 4096),
    "llama-2-7b.o_proj": (4096, 4096),
    "llama-2-7b.gate_up": (22016, 4096),
    "llama-2-7b.down": (4096, 11008),
    "llama-2-7b.lm_head": (32000, 4096),
    "qwen2.5-1.5b.qkv": (2048, 1536),
    "qwen2.5-1.5b.o_proj": (1536, 1536),
    "qwen2.5-1.5b.gate_up": (17920, 1536),
    "qwen2.5-1.5b.down": (1536, 8960),
    "qwen2.5-1.5b.lm_head": (151936, 1536),
    "odd.small": (200, 384),  # partial chunk strides, partial row groups
    "odd.tiny": (6, 8),  # one chunk: 31 lanes masked
    "odd.long": (38, 2056),  # K = 8 x 257
}
# The fusions each layer runs in the decoder ("plain" for every shape as well).
FUSIONS = {
    "qkv": ("norm",),
    "o_proj": ("residual",),
    "gate_up": ("glu",),
    "down": ("residual",),
    "lm_head": ("norm",),
    "small": ("norm", "residual", "glu"),
    "tiny": ("norm", "residual", "glu"),
    "long": ("norm", "residual", "glu"),
}
EXTRA = (  # configs start-up does not offer: uneven streaming and splits
    Gemv16Config(2, 4, 4, per_warp=3),
    Gemv16Config(1, 4, 8, split_k=3),
    Gemv16Config(2, 8, 4, per_warp=2, split_k=2),
)
TOL = {torch.bfloat16: 2e-3, torch.float16: 5e-4}  # relative (Frobenius); see check()
EPS = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}


@pytest.fixture(scope="module", autouse=True)
def _cuda_kernels() -> None:
    from nib.engine.cuda.loader import unavailable_reason

    why = unavailable_reason(DEVICE)
    if why:
        pytest.skip(f"nib's CUDA kernels are unavailable here: {why}")


def _gen(salt: int) -> torch.Generator:
    return torch.Generator(device=DEVICE).manual_seed(SEED + salt)


def _inputs(n_rows: int, k: int, dtype: torch.dtype, salt: int) -> dict[str, torch.Tensor]:
    g = _gen(salt)

    def randn(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=g, device=DEVICE) * scale).to(dtype)

    return {
        "w": randn(n_rows, k, scale=k**-0.5),
        "x": randn(k, scale=3.0),
        "nw": (1 + 0.1 * torch.randn(k, generator=g, device=DEVICE)).to(dtype),
        "b": randn(n_rows),
        "res": randn(n_rows),
    }


def check(out: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    """A correct kernel differs from the reference only where its fp32 sum lands on the
    other side of a 16-bit rounding midpoint than the exact sum (a fraction of a percent
    of the elements, by one unit): well under TOL. A missing chunk or row is not."""
    assert not out.isnan().any(), f"{what}: output not fully written (seed {SEED})"
    o, r = out.double().reshape(-1), ref.double().reshape(-1)
    rel = float((o - r).norm() / r.norm())
    worst = float((o - r).abs().max())
    bound = 2 * EPS[ref.dtype] * float(r.abs().max())
    assert rel <= TOL[ref.dtype] and worst <= bound, (
        f"{what}: relative error {rel:.2e}, worst {worst:.3g} > {bound:.3g} (seed {SEED})"
    )


def run(
    fusion: str, cfg: Gemv16Config, t: dict[str, torch.Tensor], bias: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(kernel output, reference) for one fusion, the output poisoned first."""
    w, x, nw = t["w"], t["x"], t["nw"]
    b = t["b"] if bias and fusion != "glu" else None
    n = w.shape[0] // 2 if fusion == "glu" else w.shape[0]
    if fusion == "residual":
        out = t["res"].clone()
        gemv16.launch(x, w, b, out, n, cfg, epi=EPI_RESIDUAL)
        return out, gemv16.reference(x, w, b, residual=t["res"])
    out = torch.full((n,), float("nan"), dtype=w.dtype, device=DEVICE)
    norm = fusion in ("norm", "glu")
    glu = fusion == "glu"
    gemv16.launch(x, w, b, out, n, cfg, nw if norm else None, 1e-6, EPI_PLAIN, glu)
    return out, gemv16.reference(x, w, b, nw if norm else None, 1e-6, glu)


def _configs(n: int, k: int, glu: bool) -> list[Gemv16Config]:
    table = gemv16.GLU if glu else gemv16.PLAIN
    extra = [c for c in EXTRA if (c.rows, c.warps, c.unroll) in table]
    sms = torch.cuda.get_device_properties(DEVICE).multi_processor_count
    return list(dict.fromkeys([*gemv16.candidates(n, k, glu, sms), *extra]))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("layer", SHAPES)
def test_every_config_and_fusion_matches_the_reference(layer: str, dtype: torch.dtype) -> None:
    n_rows, k = SHAPES[layer]
    t = _inputs(n_rows, k, dtype, salt=n_rows + k)
    for fusion in ("plain", *FUSIONS[layer.rsplit(".", 1)[1]]):
        glu = fusion == "glu"
        n = n_rows // 2 if glu else n_rows
        for cfg in _configs(n, k, glu):
            for bias in (False, True) if fusion != "glu" else (False,):
                out, ref = run(fusion, cfg, t, bias)
                torch.cuda.synchronize()
                check(out, ref, f"{layer} {dtype} {fusion} bias={bias} {cfg.label()}")


def test_entry_points_match_gemv_py_signatures_and_shapes() -> None:
    """kernels/gemv.py's gemv / norm_gemv / gemv_residual on a CUDA config keep the
    input's leading dims and run gemv16."""
    from nib.engine.kernels.gemv import gemv as any_gemv
    from nib.engine.kernels.gemv import gemv_residual, norm_gemv

    t = _inputs(256, 512, torch.bfloat16, salt=1)
    cfg = Gemv16Config(2, 4, 4)
    x = t["x"].view(1, 1, -1)
    y = any_gemv(x, t["w"], t["b"], cfg)
    assert y.shape == (1, 1, 256)
    check(y, gemv16.reference(x, t["w"], t["b"]), "gemv")
    y = norm_gemv(x, t["nw"], 1e-6, t["w"], None, cfg, glu=True)
    assert y.shape == (1, 1, 128)
    check(y, gemv16.reference(x, t["w"], None, t["nw"], 1e-6, glu=True), "norm_gemv glu")
    r = t["res"].view(1, 1, -1).clone()
    gemv_residual(x, t["w"], t["b"], r, cfg)
    check(r, gemv16.reference(x, t["w"], t["b"], residual=t["res"]), "gemv_residual")
    with pytest.raises(ValueError, match="GLU"):
        norm_gemv(x, t["nw"], 1e-6, t["w"], t["b"], cfg, glu=True)
    # A misaligned input: gemv16 refuses it, kernels/gemv.py's seam runs Triton instead.

    x_mis = torch.empty(513, dtype=torch.bfloat16, device=DEVICE)[1:]
    x_mis.copy_(t["x"])
    out = torch.empty(256, dtype=torch.bfloat16, device=DEVICE)
    with pytest.raises(ValueError, match="aligned"):
        gemv16.launch(x_mis, t["w"], None, out, 256, cfg)
    check(any_gemv(x_mis, t["w"], t["b"], cfg), gemv16.reference(x, t["w"], t["b"]), "fallback")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_graph_replays_and_repeated_split_launches(dtype: torch.dtype) -> None:
    """Captured once, replayed on new inputs twice: every fusion, split-K among them
    (the counters must be back at zero after each launch)."""
    n_rows, k = 1536, 8960
    t = _inputs(n_rows, k, dtype, salt=7)
    split = Gemv16Config(1, 4, 8, split_k=4)
    streamed = Gemv16Config(2, 4, 4, per_warp=2)
    glu_cfg = Gemv16Config(1, 8, 8, split_k=2)
    bufs = {c: gemv16.split_buffers(n_rows, c, DEVICE) for c in (split, glu_cfg)}
    x, w, nw, b = t["x"].clone(), t["w"], t["nw"], t["b"]
    res = t["res"].clone()
    out_norm = torch.empty(n_rows, dtype=dtype, device=DEVICE)
    out_glu = torch.empty(n_rows // 2, dtype=dtype, device=DEVICE)

    def step() -> None:
        gemv16.launch(x, w, b, out_norm, n_rows, split, nw, 1e-6, buffers=bufs[split])
        gemv16.launch(x, w, b, res, n_rows, streamed, epi=EPI_RESIDUAL)
        gemv16.launch(x, w, None, out_glu, n_rows // 2, glu_cfg, nw, 1e-6, glu=True,
                      buffers=bufs[glu_cfg])  # fmt: skip

    for _ in range(3):  # repeated eager launches: counters reset each time
        res.copy_(t["res"])
        step()
        torch.cuda.synchronize()
        check(out_norm, gemv16.reference(x, w, b, nw, 1e-6), "eager norm split")
        check(res, gemv16.reference(x, w, b, residual=t["res"]), "eager residual")
        check(out_glu, gemv16.reference(x, w, None, nw, 1e-6, glu=True), "eager glu split")
    step()  # warm-up before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for salt in (11, 12):
        fresh = _inputs(n_rows, k, dtype, salt=salt)
        x.copy_(fresh["x"])
        res.copy_(fresh["res"])
        out_norm.fill_(float("nan"))
        out_glu.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        check(out_norm, gemv16.reference(x, w, b, nw, 1e-6), "graph norm split")
        check(res, gemv16.reference(x, w, b, residual=fresh["res"]), "graph residual")
        check(out_glu, gemv16.reference(x, w, None, nw, 1e-6, glu=True), "graph glu split")
    for buffers in bufs.values():
        assert buffers is not None and not buffers[1].any(), "split-K counters left set"


def _force_cuda(model: torch.nn.Module) -> None:
    """Every GemvLinear on CUDA configs (split-K for the residual layers, to cover it)."""
    from nib.engine.kernels.gemv import GemvLinear

    for name, m in list(model.named_modules()):
        if not isinstance(m, GemvLinear):
            continue
        glu = m.fusion == "norm_glu"
        fused = Gemv16Config(1, 4, 8, split_k=2) if m.fusion == "residual" else None
        if fused is None:
            fused = Gemv16Config(2, 4, 4) if glu else Gemv16Config(1, 8, 8, per_warp=2)
        new = GemvLinear(m, Gemv16Config(2, 4, 4), m.fusion, fused if m.fusion else None)  # type: ignore[arg-type]
        parent_name, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, attr, new)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@torch.inference_mode()
def test_model_on_cuda_gemv_matches_torch_and_passes_the_self_check(
    arch: str, tmp_path: Path
) -> None:
    """A decode step with every linear on the CUDA GEMV (fused glue on) against the
    reference path; the self-check's linear cases run the CUDA kernel and pass."""
    from nib.engine.kernel_paths import linears
    from nib.engine.kernels.decode_attention import DecodeAttention
    from nib.engine.kernels.gemv import swap_in_gemv
    from nib.engine.loader import load_model
    from nib.engine.ops import TorchOps, TritonOps
    from nib.engine.selfcheck import run_case
    from nib.engine.selfcheck_cases import CaseBuilder

    from .models import save_random_hf_model

    model_dir = save_random_hf_model(arch, tmp_path / arch)
    model = load_model(model_dir, device="cuda", dtype=torch.float16)
    model.setup_cache(128)
    ref_model = load_model(model_dir, device="cuda", dtype=torch.float16)
    ref_model.setup_cache(128)
    prompt = torch.randint(0, 256, (1, 20), device="cuda", generator=_gen(3))
    model.ops = TritonOps()
    swap_in_gemv(model, tune=False)
    _force_cuda(model)
    labels = {m.kernel(1) for _, m in linears(model)}  # type: ignore[operator]
    assert all(label.startswith("cuda gemv16 ") for label in labels), labels
    assert any(label.endswith("+norm_glu") for label in labels), labels
    ref_model.ops = TorchOps()
    pos = torch.arange(20, device="cuda")
    fast = model(prompt, pos, 20, last_only=True)
    slow = ref_model(prompt, pos, 20, last_only=True)
    tok = torch.tensor([[int(slow[0, -1].argmax())]], device="cuda")
    fast = model(tok, torch.tensor([20], device="cuda"), 21).float()
    slow = ref_model(tok, torch.tensor([20], device="cuda"), 21).float()
    rel = float((fast - slow).norm() / slow.norm())
    assert rel <= 1e-2, f"decode logits differ by {rel:.2e}"
    cfg = model.cfg
    attention = DecodeAttention(cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, 128, DEVICE)
    builder = CaseBuilder(model, (1,), attention, None)
    for name, module in linears(model):
        case = builder._linear_case(name, module, 1)
        assert case.path().startswith("cuda gemv16 "), case.path()
        result = run_case(case)
        assert result.passed, result.describe()


@torch.inference_mode()
def test_tuned_swap_offers_the_cuda_kernel_and_runs_its_choice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """swap_in_gemv(tune=True) times the CUDA configs beside the Triton tiles (in a CUDA
    graph) and whatever it keeps computes the right thing."""
    from nib.engine.kernel_paths import linears
    from nib.engine.kernels import gemv as gemv_py
    from nib.engine.kernels.gemv import _candidates, swap_in_gemv
    from nib.engine.loader import load_model
    from nib.engine.ops import TritonOps

    from .models import save_random_hf_model

    monkeypatch.setattr(gemv_py, "CANDIDATES", gemv_py.CANDIDATES[:2])  # fewer JIT compiles
    model_dir = save_random_hf_model("qwen2", tmp_path / "q", hidden=1536, layers=2)
    model = load_model(model_dir, device="cuda", dtype=torch.bfloat16)
    w = model.layers[0].feed_forward.w_gate_up.weight
    assert any(isinstance(c, Gemv16Config) for c in _candidates(w, "norm_glu"))
    model.ops = TritonOps()
    labels = swap_in_gemv(model, tune=True)
    assert labels
    for _, m in linears(model):
        x = torch.randn(1, 1, m.in_features, device="cuda", dtype=torch.bfloat16)
        ref = gemv16.reference(x, m.weight, m.bias)
        check(m(x), ref, f"tuned {m.kernel(1)}")  # type: ignore[operator]
