"""nib's CUDA INT4 tensor-core kernel (engine/cuda/w4a16.cu) against fp32 references.

Over the Llama-2-7B and Qwen2.5-Coder-1.5B layer shapes and the shipped model's,
every one-row tile config (plain), each fusion (norm, residual, SiLU·mul) with
and without split-K, 2..16 rows and prefill sizes: fresh random inputs each
case, outputs poisoned with NaN and checked fully written, relative error
(Frobenius) at most 1e-3 for fp16 outputs (bf16 outputs are rounded to 8 bits of
mantissa: 4e-3) and no element off by more than 1% of the largest output. The
split-K counters must reset (two launches, same bits) and captured graphs must
replay correctly on new inputs.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from nib.engine.cuda import loader
from nib.engine.cuda.w4a16 import MULTI_ROW, ONE_ROW, CudaInt4, W4Config
from nib.engine.quant.format import QuantShapeError, dequantize
from tests.gpu.test_int4_kernels import SHAPES as INT4_SHAPES

pytestmark = pytest.mark.gpu

# The 7B and 1.5B layers of the Triton INT4 tests (without their N = 200 layer, which
# this packing refuses; see test_unsupported_shape_is_refused_by_name), and the shipped
# model's.
SHAPES = {
    **{name: shape for name, shape in INT4_SHAPES.items() if shape[1] % 16 == 0},
    "tiny.qkv": (384, 640),
    "tiny.gate_up": (384, 2048),
    "tiny.down": (1024, 384),
}
FUSION_OF = {"qkv": "norm", "o_proj": "residual", "gate_up": "norm_glu", "down": "residual"}
EPS = 1e-6
_CACHE: dict[tuple[str, str], tuple[CudaInt4, torch.Tensor]] = {}


@pytest.fixture(autouse=True)
def _needs_kernels() -> None:
    why = loader.unavailable_reason(torch.device("cuda"))
    if why:
        pytest.fail(f"nib CUDA kernels unavailable on this GPU: {why}")


def packed(
    layer: str, fusion: str = "", dtype: torch.dtype = torch.float16
) -> tuple[CudaInt4, torch.Tensor]:
    """A random weight of the layer's shape, packed for `fusion`, and its fp32 weight."""
    key = (layer, fusion)
    if key not in _CACHE:
        _CACHE.clear()  # one shape's fp32 reference at a time
        k, n = SHAPES[layer]
        g = torch.Generator(device="cuda").manual_seed(n * 7 + k)
        codes = torch.randint(0, 16, (n, k), generator=g, device="cuda", dtype=torch.uint8)
        scales = (torch.rand(k // 128, n, generator=g, device="cuda") * 0.02 + 0.001).half()
        p = CudaInt4(codes, scales, None, fusion, layer, dtype)
        _CACHE[key] = (p, dequantize(codes, scales))
    return _CACHE[key]


def _compare(
    out: torch.Tensor, ref: torch.Tensor, what: str, dtype: torch.dtype, glu: bool = False
) -> None:
    torch.cuda.synchronize()
    assert not out.isnan().any(), f"{what}: output not fully written"
    err = out.float() - ref
    rel = float(err.norm() / ref.norm())
    worst = float(err.abs().max() / ref.abs().max())
    bound = (1e-3 if dtype == torch.float16 else 4e-3) * (2 if glu else 1)
    assert rel <= bound and worst <= 1e-2, (
        f"{what}: rel {rel:.2e} (bound {bound:.0e}), worst {worst:.2e}"
    )


def _x(k: int, m: int = 1, scale: float = 1.0, dtype: torch.dtype = torch.float16) -> torch.Tensor:
    return (torch.randn(m, k, device="cuda") * scale).to(dtype)


@pytest.mark.parametrize("cfg", ONE_ROW, ids=lambda c: c.label())
@pytest.mark.parametrize("layer", SHAPES)
def test_one_row_every_config(layer: str, cfg: W4Config) -> None:
    p, w32 = packed(layer)
    x = _x(p.k)
    out = torch.full((1, p.n), float("nan"), device="cuda", dtype=torch.float16)
    p.run(x, out, 1, cfg, 0)
    _compare(out, x.float() @ w32.t(), f"{layer} {p.effective(cfg, 1).label()}", torch.float16)


FUSED_CONFIGS = (
    W4Config(1, 4, 4, 1),
    W4Config(2, 4, 2, 2),
    W4Config(4, 4, 2, 4),
    W4Config(1, 8, 4, 1),
    W4Config(1, 4, 4, 2, bulk=True),
    W4Config(2, 4, 3, 1, bulk=True),
    W4Config(4, 4, 2, 4, bulk=True),
    W4Config(1, 16, 6, 1),
    W4Config(1, 16, 3, 1, bulk=True),
)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("cfg", FUSED_CONFIGS, ids=lambda c: c.label())
@pytest.mark.parametrize("layer", [s for s in SHAPES if s.split(".")[1] in FUSION_OF])
def test_fused_glue(layer: str, cfg: W4Config, dtype: torch.dtype) -> None:
    fusion = FUSION_OF[layer.split(".")[1]]
    p, w32 = packed(layer, fusion, dtype)
    k = p.k
    if fusion == "residual":
        x = _x(k, dtype=dtype)
        residual = torch.randn(p.n, device="cuda").to(dtype)
        out = residual.clone()
        p.residual(x, out, cfg)
        ref = residual.float() + (x.half().float() @ w32.t()).to(dtype).float()
        _compare(out, ref.view(-1), f"{layer} {cfg.label()} residual", dtype)
        return
    h = _x(k, scale=3.0, dtype=dtype)
    nw = (torch.randn(k, device="cuda") * 0.1 + 1).to(dtype)
    out = torch.full((p.out_features,), float("nan"), device="cuda", dtype=dtype)
    out.copy_(p.norm(h, nw, EPS, cfg).view(-1))
    hf = h.float()
    xn = (nw * (hf * torch.rsqrt(hf.pow(2).mean() + EPS)).to(dtype)).half().float()
    ref = (xn @ w32.t()).view(-1)
    glu = fusion == "norm_glu"
    if glu:
        gate, up = (r.to(dtype).float() for r in ref.chunk(2))
        ref = F.silu(gate).to(dtype).float() * up
    _compare(out, ref, f"{layer} {cfg.label()} {fusion}", dtype, glu)


@pytest.mark.parametrize("m", [2, 3, 8, 9, 16])
@pytest.mark.parametrize("cfg", MULTI_ROW, ids=lambda c: c.label())
@pytest.mark.parametrize(
    "layer", ["llama-2-7b.qkv", "llama-2-7b.down", "qwen2.5-1.5b.o_proj", "tiny.gate_up"]
)
def test_multi_row(layer: str, cfg: W4Config, m: int) -> None:
    fusion = "norm_glu" if layer.endswith("gate_up") else ""  # the [gate | up] unpermute
    p, w32 = packed(layer, fusion)
    x = _x(p.k, m)
    out = torch.full((m, p.n), float("nan"), device="cuda", dtype=torch.float16)
    p.run(x, out, m, cfg, 3 if fusion else 0)
    _compare(out, x.float() @ w32.t(), f"{layer} m={m} {cfg.label()}", torch.float16)


@pytest.mark.parametrize("m", [1, 5, 16, 64, 512])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_linear_any_rows_with_bias(m: int, dtype: torch.dtype) -> None:
    """CudaInt4.linear at every row count (prefill sizes through dequant + cuBLAS)."""
    k, n = SHAPES["qwen2.5-1.5b.qkv"]
    g = torch.Generator(device="cuda").manual_seed(m)
    codes = torch.randint(0, 16, (n, k), generator=g, device="cuda", dtype=torch.uint8)
    scales = (torch.rand(k // 128, n, generator=g, device="cuda") * 0.02 + 0.001).half()
    bias = torch.randn(n, device="cuda").to(dtype)
    p = CudaInt4(codes, scales, bias, "", "qkv", dtype)
    x = _x(k, m, dtype=dtype).view(1, m, k)
    out = p.linear(x)
    assert out.shape == (1, m, n) and out.dtype == dtype
    ref = x.half().float() @ dequantize(codes, scales).t() + bias.float()
    _compare(out, ref, f"linear m={m}", dtype)


def test_dequantize16_matches_the_logical_weight() -> None:
    for fusion in ("", "norm_glu"):
        p, w32 = packed("tiny.gate_up", fusion)
        w = p.dequantize16()
        torch.cuda.synchronize()
        assert torch.equal(w, w32.half()), f"fusion {fusion!r}"
        codes, _ = p.unpack()
        assert codes.shape == (p.n, p.k)


def test_split_counters_reset_and_results_repeat() -> None:
    p, w32 = packed("llama-2-7b.o_proj")
    cfg = W4Config(1, 4, 4, 4)
    x = _x(p.k)
    first = torch.full((1, p.n), float("nan"), device="cuda", dtype=torch.float16)
    second = first.clone()
    p.run(x, first, 1, cfg, 0)
    p.run(x, second, 1, cfg, 0)
    torch.cuda.synchronize()
    assert torch.equal(first, second)
    _, counters = p._buffers[(p.effective(cfg, 1), 1)]
    assert int(counters.abs().sum()) == 0
    _compare(first, x.float() @ w32.t(), "split 4", torch.float16)


@pytest.mark.parametrize("m", [1, 3, 16])
@pytest.mark.parametrize("splits", [2, 4])
def test_cluster_merge_equals_the_global_merge_bit_for_bit(m: int, splits: int) -> None:
    """Split-K merged in a thread-block cluster sums the same partials in the same
    order as the global merge: the outputs are identical, the fused residual epilogue
    included, and a captured graph replays them."""
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("thread-block clusters need sm_90")
    p, w32 = packed("qwen2.5-1.5b.down", "residual" if m == 1 else "")
    plain = W4Config(1, 4, 4, splits)
    clustered = W4Config(1, 4, 4, splits, cluster=True)
    assert p.effective(clustered, m).cluster and p.effective(clustered, m).splits == splits
    x = _x(p.k, m)
    res = torch.randn(m, p.n, device="cuda").half()
    outs = []
    for cfg in (plain, clustered):
        out = res.clone()
        p.run(x, out, m, cfg, 1 if m == 1 else 0)
        outs.append(out)
    torch.cuda.synchronize()
    assert torch.equal(outs[0], outs[1])
    ref = x.float() @ w32.t() + (res.float() if m == 1 else 0)
    _compare(outs[1], ref, f"cluster s{splits} m={m}", torch.float16)
    graph_out = res.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        p.run(x, graph_out, m, clustered, 1 if m == 1 else 0)
    graph_out.copy_(res)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(graph_out, outs[1])


XPF = [c for c in MULTI_ROW if c.xpf]


@pytest.mark.parametrize("m", [3, 16])
@pytest.mark.parametrize("cfg", XPF, ids=lambda c: c.label())
def test_xpf_twin_equals_its_plain_kernel_bit_for_bit(cfg: W4Config, m: int) -> None:
    """Loading a group's activations one group ahead moves loads, not arithmetic: each
    xpf twin's output equals its plain kernel's exactly, on a layer whose blocks have
    several groups per warp (the ring of fragments turns over) and a last partial step."""
    if cfg.bulk and torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("bulk copies need sm_90")
    p, w32 = packed("llama-2-7b.down", "")  # 86 groups: no warp count divides them
    plain = W4Config(cfg.r, cfg.warps, cfg.pf, 1, cfg.bulk)
    assert p.effective(cfg, m).xpf and not p.effective(plain, m).xpf
    x = _x(p.k, m)
    outs = []
    for c in (plain, cfg):
        out = torch.full((m, p.n), float("nan"), device="cuda", dtype=torch.float16)
        p.run(x, out, m, c, 0)
        outs.append(out)
    torch.cuda.synchronize()
    _compare(outs[1], x.float() @ w32.t(), f"{cfg.label()} m={m}", torch.float16)
    assert torch.equal(outs[0], outs[1]), cfg.label()


def test_graph_replay_with_new_inputs() -> None:
    """A captured sequence norm -> residual -> glu (split-K on) replays right on new inputs."""
    dtype = torch.bfloat16
    g = torch.Generator(device="cuda").manual_seed(3)

    def make(n: int, k: int, fusion: str, cfg: W4Config) -> tuple[CudaInt4, torch.Tensor]:
        codes = torch.randint(0, 16, (n, k), generator=g, device="cuda", dtype=torch.uint8)
        scales = (torch.rand(k // 128, n, generator=g, device="cuda") * 0.02 + 0.001).half()
        p = CudaInt4(codes, scales, None, fusion, fusion, dtype)
        p.one_row = cfg
        p.prepare(p.one_row, 1)
        return p, dequantize(codes, scales)

    # Consecutive kernels each read what the previous one wrote (programmatic dependent
    # launch on sm_90: each must wait before touching it).
    qkv, w_qkv = make(2048, 1536, "norm", W4Config(2, 4, 2, 2))
    o, w_o = make(1536, 2048, "residual", W4Config(1, 4, 4, 2, bulk=True))
    up, w_up = make(2 * 4480, 1536, "norm_glu", W4Config(1, 4, 6, 1, bulk=True))
    h = torch.zeros(1536, device="cuda", dtype=dtype)
    nw = torch.zeros(1536, device="cuda", dtype=dtype)
    res = torch.zeros(1536, device="cuda", dtype=dtype)
    outs: dict[str, torch.Tensor] = {}

    def body() -> None:
        outs["qkv"] = qkv.norm(h, nw, EPS)
        o.residual(outs["qkv"], res)
        outs["glu"] = up.norm(res, nw, EPS)

    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        body()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            body()
    for _ in range(3):
        h.copy_(torch.randn(1536, device="cuda").to(dtype) * 3)
        nw.copy_((torch.randn(1536, device="cuda") * 0.1 + 1).to(dtype))
        start = torch.randn(1536, device="cuda").to(dtype)
        res.copy_(start)
        graph.replay()
        torch.cuda.synchronize()

        def normed(v: torch.Tensor) -> torch.Tensor:
            f = v.float()
            return (nw * (f * torch.rsqrt(f.pow(2).mean() + EPS)).to(dtype)).half().float()

        ref_qkv = normed(h) @ w_qkv.t()
        _compare(outs["qkv"], ref_qkv, "graph qkv", dtype)
        ref_res = start.float() + (outs["qkv"].half().float() @ w_o.t()).to(dtype).float()
        _compare(res, ref_res, "graph residual", dtype)
        gate, upv = ((normed(res) @ w_up.t()).to(dtype).float()).chunk(2)
        _compare(outs["glu"], F.silu(gate).to(dtype).float() * upv, "graph glu", dtype, True)


def test_unsupported_shape_is_refused_by_name() -> None:
    codes = torch.zeros(200, 384, device="cuda", dtype=torch.uint8)
    scales = torch.ones(3, 200, device="cuda", dtype=torch.float16)
    with pytest.raises(QuantShapeError, match=r"layers\.0\.odd"):
        CudaInt4(codes, scales, None, "", "layers.0.odd")


def test_resources_no_spills() -> None:
    """What ptxas reported for the kernels loaded here: no local memory."""
    mod = loader.module("w4a16.cu", torch.device("cuda"))
    from nib.engine.cuda.w4a16 import kernel_name

    for cfg in ONE_ROW[:6]:
        kernel = mod.kernel(kernel_name(1, cfg, True))
        assert kernel.local_bytes == 0, kernel.name
    # the activations-ahead twins hold more registers (one bulk shape once spilled)
    for cfg in (c for c in MULTI_ROW if c.xpf):
        for mt in (1, 2):
            kernel = mod.kernel(kernel_name(mt, cfg, False))
            assert kernel.local_bytes == 0, kernel.name
