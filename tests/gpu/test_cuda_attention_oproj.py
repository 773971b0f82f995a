"""The decode attention with the INT4 o_proj fused behind it (attention.cu `_oproj`).

Against the two launches it replaces (the fused decode attention with the same splits,
then w4a16.cu's one-row GEMV with the residual epilogue), which it must equal bit for
bit where that GEMV runs unsplit with 4, 8 or 16 warps (the fused product follows its
summation order): the Qwen2.5-Coder-1.5B shape (2 KV heads x 8 splits, a cluster of 16),
the random test models' (8 and 2 KV heads of 64 dims), one KV head of a GQA group of 7
(6 splits: a portable cluster, 7 tiles x 7 groups a block) and four KV heads, bf16 and fp16,
with and without an o_proj bias, lengths from 1 through the split boundaries to
max_context; fresh random inputs each case. Also against the float64 reference (the
attention rounded as the kernel rounds it, times the fp32 dequantised weight), inside a
CUDA graph replayed at new positions, through the GraphRunner (greedy decoding with and
without it: the same tokens and logits), in the start-up self-check, and the shapes it
refuses, by rule.
"""

from __future__ import annotations

import pytest
import torch

from nib.engine.cuda import loader
from nib.engine.cuda.attention import FusedDecodeAttention, reference
from nib.engine.cuda.attention_oproj import (
    MODES,
    FusedAttentionOproj,
    order_warps,
    tiles_per_block,
)
from nib.engine.cuda.w4a16 import CudaInt4, W4Config
from nib.engine.quant.format import dequantize

from .models import save_random_hf_model
from .test_cuda_attention import rope_tables

pytestmark = pytest.mark.gpu
DEVICE = torch.device("cuda")

SHAPES = {  # heads, KV heads, head_dim, hidden
    "qwen2.5-coder-1.5b": (12, 2, 128, 1536),
    "random-qwen2": (8, 2, 64, 512),
    "random-llama": (8, 8, 64, 512),
    "g7-d128": (7, 1, 128, 672),
    "g4-d64": (16, 4, 64, 1024),
}
LENGTHS = (1, 2, 16, 17, 100, 129, 640, 1024)
ORDERS = (W4Config(1, 4, 4), W4Config(1, 8, 4), W4Config(1, 16, 4))


@pytest.fixture(autouse=True)
def _needs_sm90_kernels() -> None:
    why = loader.unavailable_reason(DEVICE)
    if why:
        pytest.fail(f"nib CUDA kernels unavailable on this GPU: {why}")
    if torch.cuda.get_device_capability(DEVICE) < (9, 0):
        pytest.skip("the fused o_proj needs sm_90 (thread-block clusters)")


class Problem:
    """Random caches, RoPE tables, o_proj weight and residual for one shape."""

    def __init__(self, name: str, s: int, dtype: torch.dtype, bias: bool = False) -> None:
        self.h, self.kvh, self.d, self.hidden = SHAPES[name]
        self.name, self.s, self.dtype = name, s, dtype
        self.gen = torch.Generator(device=DEVICE).manual_seed(hash((name, s, bias)) % 2**31)
        self.k = self.randn(1, self.kvh, s, self.d)
        self.v = self.randn(1, self.kvh, s, self.d)
        self.cos, self.sin = rope_tables(s, self.d, dtype)
        k_in = self.h * self.d
        codes = torch.randint(
            0, 16, (self.hidden, k_in), generator=self.gen, device=DEVICE, dtype=torch.uint8
        )
        scales = (torch.rand(k_in // 128, self.hidden, generator=self.gen, device=DEVICE) * 0.02
                  + 0.001).half()  # fmt: skip
        b = self.randn(self.hidden, scale=0.5) if bias else None
        self.packed = CudaInt4(codes, scales, b, "residual", f"{name}.o_proj", dtype)
        self.w32 = dequantize(codes, scales)
        self.fused = FusedAttentionOproj(self.h, self.kvh, self.d, self.hidden, s, dtype, DEVICE)
        self.attention = FusedDecodeAttention(
            self.h, self.kvh, self.d, s, dtype, DEVICE, splits=self.fused.splits, warps=8
        )

    def randn(self, *shape: int, scale: float = 1.0) -> torch.Tensor:
        x = torch.randn(*shape, device=DEVICE, generator=self.gen, dtype=torch.float32)
        return (x * scale).to(self.dtype)

    def inputs(self, p: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        qkv = self.randn(1, 1, (self.h + 2 * self.kvh) * self.d, scale=2.0)
        return qkv, torch.tensor([p], device=DEVICE), self.randn(self.hidden)

    def fused_run(
        self, qkv: torch.Tensor, pos: torch.Tensor, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        k, v, y = self.k.clone(), self.v.clone(), residual.clone()
        self.fused(qkv, pos, self.cos, self.sin, k, v, self.packed, y)
        torch.cuda.synchronize()
        return y, k, v

    def separate_run(
        self, qkv: torch.Tensor, pos: torch.Tensor, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        k, v, y = self.k.clone(), self.v.clone(), residual.clone()
        out = self.attention(qkv, pos, self.cos, self.sin, k, v)
        self.packed.residual(out.reshape(-1), y)
        torch.cuda.synchronize()
        return y, k, v

    def reference(
        self, qkv: torch.Tensor, pos: torch.Tensor, residual: torch.Tensor
    ) -> torch.Tensor:
        k, v = self.k.clone(), self.v.clone()
        out = reference(qkv, pos, self.cos, self.sin, k, v, self.h, self.kvh)
        delta = out.reshape(-1).half().float() @ self.w32.t()
        if self.packed.bias is not None:
            delta = delta + self.packed.bias.float()
        return residual.float() + delta.to(self.dtype).float()


def _close_to_reference(y: torch.Tensor, want: torch.Tensor, residual: torch.Tensor) -> None:
    """The update y - residual against the reference's: within the INT4 kernels' 1e-3
    (bf16 outputs: their rounding, 4e-3), plus what rounding the sum to the residual's
    dtype may add (half a unit in its last place of each element, twice over)."""
    bf16 = y.dtype == torch.bfloat16
    got, ref = y.float() - residual.float(), want - residual.float()
    ulp = 2.0**-8 if bf16 else 2.0**-11
    bound = (4e-3 if bf16 else 1e-3) + ulp * float(want.norm() / ref.norm())
    err = float((got - ref).norm() / ref.norm())
    assert err <= bound, f"relative error of the update {err:.2e} (bound {bound:.1e})"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("name", list(SHAPES))
def test_equals_the_attention_then_the_gemv(name: str, dtype: torch.dtype) -> None:
    prob = Problem(name, 1024, dtype, bias=name == "qwen2.5-coder-1.5b")
    for length in LENGTHS:
        qkv, pos, residual = prob.inputs(length - 1)
        for cfg, mode in ((c, m) for c in ORDERS for m in MODES):
            prob.packed.one_row = cfg
            prob.fused.mode = mode
            assert order_warps(prob.packed) == cfg.warps
            got = prob.fused_run(qkv, pos, residual)
            want = prob.separate_run(qkv, pos, residual)
            what = f"{name} {dtype} L={length} order r1w{cfg.warps} weights in {mode}"
            assert torch.equal(got[1], want[1]) and torch.equal(got[2], want[2]), (
                f"{what}: the KV-cache rows differ"
            )
            assert torch.equal(got[0], want[0]), (
                f"{what}: {(got[0] != want[0]).sum()} of {prob.hidden} outputs differ, "
                f"max {float((got[0].float() - want[0].float()).abs().max()):.3e}"
            )
        _close_to_reference(got[0], prob.reference(qkv, pos, residual), residual)


def test_a_split_gemv_config_still_runs_close() -> None:
    """With the o_proj's own config split along K the orders differ: close, not equal."""
    prob = Problem("qwen2.5-coder-1.5b", 1024, torch.bfloat16)
    prob.packed.one_row = W4Config(1, 8, 4, 2)
    assert order_warps(prob.packed) == 8
    qkv, pos, residual = prob.inputs(700)
    got = prob.fused_run(qkv, pos, residual)
    _close_to_reference(got[0], prob.reference(qkv, pos, residual), residual)


def test_graph_replays_at_new_positions() -> None:
    prob = Problem("qwen2.5-coder-1.5b", 4096, torch.bfloat16)
    prob.packed.one_row = W4Config(1, 8, 4)
    qkv = torch.empty(1, 1, (prob.h + 2 * prob.kvh) * prob.d, dtype=prob.dtype, device=DEVICE)
    pos = torch.zeros(1, dtype=torch.int64, device=DEVICE)
    y = torch.empty(prob.hidden, dtype=prob.dtype, device=DEVICE)
    k, v = prob.k.clone(), prob.v.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        prob.fused(qkv, pos, prob.cos, prob.sin, k, v, prob.packed, y)  # warm
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        prob.fused(qkv, pos, prob.cos, prob.sin, k, v, prob.packed, y)
    for p in (0, 15, 16, 511, 2047, 4095):
        q, _, residual = prob.inputs(p)
        qkv.copy_(q)
        pos.fill_(p)
        y.copy_(residual)
        k.copy_(prob.k)
        v.copy_(prob.v)
        graph.replay()
        torch.cuda.synchronize()
        want = prob.separate_run(q, torch.tensor([p], device=DEVICE), residual)
        assert torch.equal(y, want[0]), f"replay at p={p}: outputs differ"
        assert torch.equal(k, want[1]) and torch.equal(v, want[2]), f"replay at p={p}: caches"


def test_refuses_by_rule() -> None:
    # Llama-2-7B: 32 KV heads do not fit one cluster of 16 blocks.
    assert "cluster of at most 16" in tiles_per_block(32, 32, 128, 4096, 1)[1]
    # hidden 1552 = 97 tiles: not an even share over 16 blocks.
    assert "does not split" in tiles_per_block(12, 2, 128, 1552, 8)[1]
    # 16 KV heads x 1 split, hidden 8192: 32 tiles x 16 groups a block, over 72 pairs.
    assert "pairs its warps hold" in tiles_per_block(16, 16, 128, 8192, 1)[1]
    with pytest.raises(ValueError, match="cluster of at most 16"):
        FusedAttentionOproj(32, 32, 128, 4096, 1024, torch.float16, DEVICE)
    prob = Problem("random-qwen2", 256, torch.float16)
    codes = torch.randint(0, 16, (2 * 512, 512), device=DEVICE, dtype=torch.uint8)
    scales = torch.full((4, 2 * 512), 0.01, device=DEVICE).half()
    glu = CudaInt4(codes, scales, None, "norm_glu", "gate_up", torch.float16)
    assert "not 512x512" in prob.fused.supports(glu)
    assert "not nib's CUDA INT4" in prob.fused.supports(None)
    qkv, pos, residual = prob.inputs(3)
    with pytest.raises(ValueError, match="residual must be one contiguous"):
        prob.fused(qkv, pos, prob.cos, prob.sin, prob.k, prob.v, prob.packed, residual[:100])


# -- through the graph runner -----------------------------------------------------------

PROMPT = list(b"def fibonacci(n):\n    if n < 2:\n        return n\n")


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def runners(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    from nib.engine.graphs import GraphRunner
    from nib.engine.loader import load_model
    from nib.engine.ops import TritonOps
    from nib.engine.quant.linear import Int4Linear
    from nib.engine.startup import swap_in_linear_kernels

    if torch.cuda.get_device_capability(DEVICE) < (9, 0):
        pytest.skip("the fused o_proj needs sm_90")
    folder = save_random_hf_model(request.param, tmp_path_factory.mktemp(request.param))
    model = load_model(folder, quant="int4", dtype=torch.float16, device="cuda")
    model.setup_cache(512)
    model.ops = TritonOps()
    swap_in_linear_kernels(model, DEVICE, tune=False)
    for layer in model.layers:  # an unsplit config: the two paths then agree bit for bit
        wo = layer.attention.wo
        assert isinstance(wo, Int4Linear) and wo.cuda is not None
        wo.cuda.one_row = W4Config(1, 8, 4)
        wo.fused = wo.cuda.one_row
    fused = GraphRunner(model, 512, buckets=(64, 512), keep_logits=True)
    separate = GraphRunner(model, 512, buckets=(64, 512), keep_logits=True)
    assert fused.fused_oproj is not None, fused.fused_oproj_why
    assert not fused.fuse_oproj  # off unless the step tuning says
    fused.fuse_oproj = True
    # The same splits for the separate runner's attention: then the merges agree too.
    from nib.engine.cuda.attention import FusedDecodeAttention
    from nib.engine.graphs_common import decode_attend_fn

    cfg = model.cfg
    separate.fused_attention = FusedDecodeAttention(
        cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, 512, torch.float16, DEVICE,
        splits=fused.fused_oproj.splits, warps=8,
    )  # fmt: skip
    separate._decode_attend = decode_attend_fn(separate.attention, separate.fused_attention)
    for r in (fused, separate):
        r.capture()
        assert all(s.ready for s in r.states.values()), [
            (s.name, s.error) for s in r.states.values() if not s.ready
        ]
    return model, fused, separate


def _launches(runner, name: str) -> list[str]:  # type: ignore[no-untyped-def]
    """The kernels one eager run of a graph body launches (profiler names)."""
    from torch.profiler import ProfilerActivity, profile

    runner.pos.fill_(100)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        runner.bodies[name]()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type.name == "CUDA"]


def test_runner_decodes_the_same_tokens_and_logits(runners) -> None:  # type: ignore[no-untyped-def]
    model, fused, separate = runners
    for prompt in (PROMPT, PROMPT[:5], PROMPT * 4):
        a = list(fused.generate(prompt, True, 64))
        b = list(separate.generate(prompt, True, 64))
        assert len(a) == len(b) == 64
        assert a == b, "tokens or log-probabilities differ"  # exact: the same logits
        steps = []
        for runner in (fused, separate):  # one step at a time: every step's logits
            runner.prefill(prompt, True).synchronize()
            logits = []
            for i in range(24):
                runner.decode(i % 2, True).synchronize()
                logits.append(runner.last_logits.clone())
            steps.append(logits)
        for i, (la, lb) in enumerate(zip(*steps, strict=True)):
            assert torch.equal(la, lb), f"step {i}: the logits differ"
    kernels = _launches(fused, fused._decode_name(0, True))
    assert sum("_oproj" in k for k in kernels) == len(model.layers), kernels
    separate_kernels = _launches(separate, separate._decode_name(0, True))
    assert len(separate_kernels) - len(kernels) == len(model.layers)


def test_kernel_paths_and_self_check(runners) -> None:  # type: ignore[no-untyped-def]
    from nib.engine.kernel_paths import OPROJ_FUSED, gpu_paths
    from nib.engine.selfcheck import relative_error, run_self_check
    from nib.engine.selfcheck_cases import CaseBuilder

    model, fused, separate = runners
    paths = gpu_paths(model, fused)
    decode = [p.kernel for p in paths if p.op == "attention.decode"]
    assert decode == [fused.fused_oproj.label()], decode
    assert any(p.kernel == OPROJ_FUSED and p.layer.endswith("attention.wo") for p in paths)
    assert all(p.kernel != OPROJ_FUSED for p in gpu_paths(model, separate))
    builder = CaseBuilder(model, (1,), fused.attention, None, fused.fused_attention,
                          fused_oproj=fused.fused_oproj)  # fmt: skip
    cases = [c for c in builder.attention() if "o_proj" in c.shape]
    assert len(cases) == 3
    report = run_self_check(cases)
    assert all(c.passed for c in report.checks), report.summary()
    case = cases[-1]
    out = case.run(case.inputs())
    want = case.reference(case.inputs())
    assert relative_error(out, want)[0] <= case.tolerance
    wrong = (out[0] + 0.5, *out[1:])  # an update half a unit off everywhere must fail
    assert relative_error(wrong, want)[0] > case.tolerance
