"""INT4 chains (engine/cuda/w4a16.cu, "chains"): a layer's one-row products in one launch.

A chain runs the same device code as the separate launches, in the same order of
arithmetic, so its outputs must equal theirs bit for bit: o_proj + residual ->
gate_up with the RMSNorm and SiLU·mul -> down + residual -> qkv with the RMSNorm,
each reading what the one before wrote. Fresh random inputs per case, outputs
poisoned with NaN first; configs with and without split-K, both warp counts; the
counters must reset (launch after launch, and in a replayed graph).
"""

from __future__ import annotations

import pytest
import torch

from nib.engine.cuda import loader
from nib.engine.cuda.w4a16 import (
    EPI_GLU,
    EPI_PLAIN,
    EPI_RESIDUAL,
    CudaInt4,
    Int4Chain,
    W4Config,
    W4Launch,
    chain_runs,
)

pytestmark = pytest.mark.gpu
EPS = 1e-6
SHAPES = {"tiny": (384, 640, 1024), "qwen2.5-coder-1.5b": (1536, 2048, 8960)}
CONFIG_SETS = {
    "w4": {"o": W4Config(1, 4, 4), "gate_up": W4Config(2, 4, 2), "down": W4Config(1, 4, 2, 2),
           "qkv": W4Config(4, 4, 2)},
    "w4-split": {"o": W4Config(1, 4, 2, 4), "gate_up": W4Config(2, 4, 4, 2),
                 "down": W4Config(2, 4, 2, 4), "qkv": W4Config(1, 4, 4, 2)},
    "w4-light": {"o": W4Config(1, 4, 4), "gate_up": W4Config(2, 4, 2),
                 "down": W4Config(1, 4, 2, 2), "qkv": W4Config(1, 4, 4, 2)},
    "w8": {"o": W4Config(1, 8, 4), "gate_up": W4Config(2, 8, 2), "down": W4Config(1, 8, 4, 2),
           "qkv": W4Config(1, 8, 2)},
}  # fmt: skip


@pytest.fixture(autouse=True)
def _needs_kernels() -> None:
    why = loader.unavailable_reason(torch.device("cuda"))
    if why:
        pytest.fail(f"nib CUDA kernels unavailable on this GPU: {why}")


class Layer:
    def __init__(self, shape: str, seed: int, dtype: torch.dtype = torch.float16) -> None:
        hidden, qkv, inter = SHAPES[shape]
        g = torch.Generator(device="cuda").manual_seed(seed)
        self.g = g

        def weight(n: int, k: int, fusion: str, name: str) -> CudaInt4:
            codes = torch.randint(0, 16, (n, k), generator=g, device="cuda", dtype=torch.uint8)
            scales = (torch.rand(k // 128, n, generator=g, device="cuda") * 0.02 + 0.001).half()
            return CudaInt4(codes, scales, None, fusion, name, dtype)

        self.o = weight(hidden, hidden, "residual", "o_proj")
        self.gate_up = weight(2 * inter, hidden, "norm_glu", "gate_up")
        self.down = weight(hidden, inter, "residual", "down")
        self.qkv = weight(qkv, hidden, "norm", "qkv")
        self.attn = torch.empty(hidden, device="cuda", dtype=dtype)
        self.h = torch.empty(hidden, device="cuda", dtype=dtype)
        self.nw = (1 + 0.1 * torch.randn(hidden, device="cuda", generator=g)).to(dtype)
        self.glu = torch.empty(inter, device="cuda", dtype=dtype)
        self.out = torch.empty(qkv, device="cuda", dtype=dtype)
        self.fresh()

    def fresh(self) -> None:
        """New random inputs, poisoned outputs."""
        self.attn.copy_(torch.randn(self.attn.shape, device="cuda", generator=self.g))
        self.h.copy_(3 * torch.randn(self.h.shape, device="cuda", generator=self.g))
        self.glu.fill_(float("nan"))
        self.out.fill_(float("nan"))

    def launches(self, cfgs: dict[str, W4Config]) -> list[W4Launch]:
        return [
            self.o.op(self.attn, self.h, 1, cfgs["o"], EPI_RESIDUAL),
            self.gate_up.op(self.h, self.glu, 1, cfgs["gate_up"], EPI_GLU, self.nw, EPS),
            self.down.op(self.glu, self.h, 1, cfgs["down"], EPI_RESIDUAL),
            self.qkv.op(self.h, self.out, 1, cfgs["qkv"], EPI_PLAIN, self.nw, EPS),
        ]

    def separate(self, cfgs: dict[str, W4Config]) -> None:
        self.o.residual(self.attn, self.h, cfgs["o"])
        self.glu.copy_(self.gate_up.norm(self.h, self.nw, EPS, cfgs["gate_up"]))
        self.down.residual(self.glu, self.h, cfgs["down"])
        self.out.copy_(self.qkv.norm(self.h, self.nw, EPS, cfgs["qkv"]))

    def outputs(self) -> tuple[torch.Tensor, ...]:
        return self.h.clone(), self.glu.clone(), self.out.clone()


def _expected(layer: Layer, cfgs: dict[str, W4Config]) -> tuple[torch.Tensor, ...]:
    """The separate launches' outputs on the layer's current inputs (inputs restored)."""
    attn, h = layer.attn.clone(), layer.h.clone()
    layer.separate(cfgs)
    torch.cuda.synchronize()
    out = layer.outputs()
    assert all(torch.isfinite(t).all() for t in out), "the reference launches left NaN"
    layer.attn.copy_(attn)
    layer.h.copy_(h)
    layer.glu.fill_(float("nan"))
    layer.out.fill_(float("nan"))
    return out


def _same(got: tuple[torch.Tensor, ...], want: tuple[torch.Tensor, ...]) -> None:
    for name, a, b in zip(("h", "glu", "qkv"), got, want, strict=True):
        assert torch.equal(a, b), f"{name}: chain != separate launches"


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("configs", CONFIG_SETS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_chain_equals_the_separate_launches(shape: str, configs: str, dtype: torch.dtype) -> None:
    cfgs = CONFIG_SETS[configs]
    layer = Layer(shape, 11, dtype)
    chain = Int4Chain(layer.launches(cfgs))
    for _ in range(3):  # the counters reset: the next launch is right too
        layer.fresh()
        want = _expected(layer, cfgs)
        chain.launch()
        torch.cuda.synchronize()
        _same(layer.outputs(), want)


def test_chains_replay_in_a_graph_with_new_inputs() -> None:
    """Two layers' chains back to back (each with its own counters), captured once,
    replayed on new inputs; the second layer reads what the first wrote."""
    cfgs = CONFIG_SETS["w4-split"]
    a, b = Layer("tiny", 1), Layer("tiny", 2)
    b.attn = a.out[: b.attn.numel()]  # layer b's input is layer a's last output
    chains = [Int4Chain(a.launches(cfgs)), Int4Chain(b.launches(cfgs))]
    for c in chains:
        c.launch()
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        for c in chains:
            c.launch()
    for _ in range(2):
        a.fresh()
        b.h.copy_(torch.randn(b.h.shape, device="cuda"))
        b_h = b.h.clone()
        want_a = _expected(a, cfgs)
        b.attn = want_a[2][: b.attn.numel()].clone()
        want_b = _expected(b, cfgs)
        b.h.copy_(b_h)
        b.attn = a.out[: b.attn.numel()]
        graph.replay()
        torch.cuda.synchronize()
        _same(a.outputs(), want_a)
        _same(b.outputs(), want_b)


def test_what_a_chain_refuses() -> None:
    layer = Layer("tiny", 3)
    mixed = {**CONFIG_SETS["w4"], "down": W4Config(1, 8, 4)}
    with pytest.raises(ValueError, match="one warp count"):
        Int4Chain(layer.launches(mixed))
    bulk = {**CONFIG_SETS["w4"], "down": W4Config(1, 4, 4, 1, True)}
    assert not chain_runs(bulk["down"])
    with pytest.raises(ValueError, match="cannot run in a chain"):
        Int4Chain(layer.launches(bulk))
    with pytest.raises(ValueError, match="1 to 8 ops"):
        Int4Chain([])
