"""The greedy pick fused into the INT4 lm_head's epilogue (w4a16.cu + pick.cuh).

Against the same launch without the pick and torch's argmax / logsumexp over its
output: on the lm_head shapes of Llama-2-7B and Qwen2.5-1.5B and a small odd one,
fp16 and bf16, every kind of launch the lm_head may take (register and bulk
pipelines, split-K merged in global memory or in a cluster, 1-4 tiles a block);
fresh random weights and inputs, pinned outputs poisoned before every launch and
read after an event, as the engine reads them. The logits must be bit for bit the
unfused launch's, the token torch.argmax's (first index on ties: a row duplicated
below the winner must take its place), the log-probability within 1e-4, the
device token and the position written, the counter reset. Then inside a CUDA
graph replayed on new inputs, and through the GraphRunner: greedy decoding with
the pick fused equals the runner with the greedy kernel after the lm_head.
"""

from __future__ import annotations

import math

import pytest
import torch

from nib.engine.cuda import loader
from nib.engine.cuda.greedy import CudaGreedy, FusedPick
from nib.engine.cuda.w4a16 import CudaInt4, W4Config

from .models import save_random_hf_model

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")
ATOL, RTOL = 1e-4, 1e-5
EPS = 1e-6
SHAPES = {  # (K, N)
    "llama-2-7b.lm_head": (4096, 32000),
    "qwen2.5-1.5b.lm_head": (1536, 151936),
    "odd.lm_head": (384, 1088),  # 68 tiles: 17 blocks of 4, one group
}
# One of each kind of launch (the effective config is fitted to the shape).
CONFIGS = (
    W4Config(1, 4, 4),
    W4Config(2, 4, 2),
    W4Config(4, 4, 2),
    W4Config(1, 16, 6),
    W4Config(1, 4, 4, bulk=True),
    W4Config(4, 4, 2, bulk=True),
    W4Config(2, 4, 3, bulk=True),
    W4Config(1, 4, 4, 2),
    W4Config(2, 4, 2, 4),
    W4Config(1, 8, 2, 2, cluster=True),
    W4Config(2, 4, 2, 4, cluster=True),
)


@pytest.fixture(autouse=True)
def _needs_kernels() -> None:
    why = loader.unavailable_reason(CUDA)
    if why:
        pytest.fail(f"nib CUDA kernels unavailable on this GPU: {why}")


def _weight(k: int, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator(device=CUDA).manual_seed(seed)
    codes = torch.randint(0, 16, (n, k), generator=g, device=CUDA, dtype=torch.uint8)
    scales = (torch.rand(k // 128, n, generator=g, device=CUDA) * 0.02 + 0.001).half()
    return codes, scales


def _inputs(k: int, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator(device=CUDA).manual_seed(seed)
    h = (torch.randn(k, device=CUDA, generator=g) * 2).to(dtype)
    nw = (1 + 0.1 * torch.randn(k, device=CUDA, generator=g)).to(dtype)
    return h, nw


def _pinned() -> tuple[torch.Tensor, torch.Tensor]:
    return (
        torch.full((1,), -1, dtype=torch.int64).pin_memory(),
        torch.full((1,), math.nan).pin_memory(),
    )


def _after_event() -> None:
    event = torch.cuda.Event()
    event.record()
    event.synchronize()


def _want(logits: torch.Tensor) -> tuple[int, float]:
    row = logits.float().reshape(-1)
    token = int(row.argmax())
    return token, float(row[token] - row.logsumexp(0))


def _check(
    token: torch.Tensor, logprob: torch.Tensor, logits: torch.Tensor, what: str
) -> tuple[int, float]:
    want_token, want_logprob = _want(logits)
    assert int(token[0]) == want_token, f"{what}: token {int(token[0])} != {want_token}"
    assert math.isfinite(float(logprob[0])), f"{what}: log-probability not written"
    assert float(logprob[0]) == pytest.approx(want_logprob, abs=ATOL, rel=RTOL), what
    return want_token, want_logprob


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.label())
@pytest.mark.parametrize("layer", list(SHAPES))
def test_fused_pick_equals_the_launch_then_argmax(
    layer: str, cfg: W4Config, dtype: torch.dtype
) -> None:
    k, n = SHAPES[layer]
    codes, scales = _weight(k, n, n + k)
    packed = CudaInt4(codes, scales, None, "norm", layer, dtype)
    eff = packed.effective(cfg, 1)
    packed.prepare(eff, 1)
    greedy = CudaGreedy(n, 1, CUDA)
    pick = FusedPick(greedy, packed.tiles)
    device_token = torch.empty(1, dtype=torch.int64, device=CUDA)
    position = torch.tensor([500], dtype=torch.int64, device=CUDA)
    for seed in range(3):  # repeated launches: the counter must have reset itself
        h, nw = _inputs(k, dtype, 31 * seed + n)
        plain = packed.norm(h, nw, EPS, eff)
        token, logprob = _pinned()
        device_token.fill_(-1)
        pointers = pick.pointers(token, logprob, device_token, position)
        assert pointers is not None, "the driver did not map pinned memory"
        picked = packed.norm(h, nw, EPS, eff, pick=pointers)
        _after_event()
        what = f"{layer} {eff.label()} {dtype} seed={seed}"
        assert torch.equal(picked, plain), f"{what}: the logits differ from the plain launch"
        want_token, _ = _check(token, logprob, plain, what)
        assert int(device_token[0]) == want_token, what
        assert int(position[0]) == 501 + seed, f"{what}: the position must move on by one"
        assert not pick.counter.any(), f"{what}: a counter was left set"


@pytest.mark.parametrize("cfg", [W4Config(4, 4, 2, bulk=True), W4Config(1, 4, 4, 2)], ids=str)
def test_ties_go_to_the_first_index(cfg: W4Config) -> None:
    """The winner's row copied to a lower index: both logits equal bit for bit (same
    weights, same inputs, same order of sums), and torch.argmax takes the first."""
    k, n = SHAPES["llama-2-7b.lm_head"]
    codes, scales = _weight(k, n, 7)
    h, nw = _inputs(k, torch.float16, 8)
    first = CudaInt4(codes, scales, None, "norm", "lm_head", torch.float16)
    top = int(first.norm(h, nw, EPS, first.effective(cfg, 1)).float().argmax())
    low = top // 3  # another tile, usually another block
    if low == top:
        pytest.skip("the winner is row 0 here")
    codes[low], scales[:, low] = codes[top], scales[:, top]
    packed = CudaInt4(codes, scales, None, "norm", "lm_head", torch.float16)
    eff = packed.effective(cfg, 1)
    packed.prepare(eff, 1)
    pick = FusedPick(CudaGreedy(n, 1, CUDA), packed.tiles)
    token, logprob = _pinned()
    pointers = pick.pointers(token, logprob)
    assert pointers is not None
    logits = packed.norm(h, nw, EPS, eff, pick=pointers)
    _after_event()
    assert logits[low] == logits[top] and int(logits.float().argmax()) == low
    _check(token, logprob, logits, f"tie {low}/{top}")
    assert int(token[0]) == low


def test_refused_where_it_cannot_run() -> None:
    k, n = SHAPES["odd.lm_head"]
    codes, scales = _weight(k, n, 3)
    h, nw = _inputs(k, torch.float16, 4)
    glu = CudaInt4(codes, scales, None, "norm_glu", "w_gate_up", torch.float16)
    small = FusedPick(CudaGreedy(n, 1, CUDA), 2)
    token, logprob = _pinned()
    pointers = small.pointers(token, logprob)
    assert pointers is not None
    with pytest.raises(ValueError, match="plain packing"):
        glu.norm(h, nw, EPS, pick=pointers)
    plain = CudaInt4(codes, scales, None, "norm", "lm_head", torch.float16)
    with pytest.raises(ValueError, match="workspace holds 2"):
        plain.norm(h, nw, EPS, W4Config(1, 4, 4), pick=pointers)
    with pytest.raises(ValueError, match="one row"):
        plain.run(
            h[None].expand(2, -1).contiguous(),
            torch.empty(2, n, device=CUDA, dtype=torch.float16),
            2,
            W4Config(),
            0,
            pick=pointers,
        )


def test_graph_replays_pick_on_new_inputs() -> None:
    k, n = SHAPES["qwen2.5-1.5b.lm_head"]
    codes, scales = _weight(k, n, 11)
    packed = CudaInt4(codes, scales, None, "norm", "lm_head", torch.float16)
    cfg = packed.effective(W4Config(2, 4, 3, bulk=True), 1)
    pick = FusedPick(CudaGreedy(n, 1, CUDA), packed.tiles)
    h, nw = _inputs(k, torch.float16, 12)
    token, logprob = _pinned()
    device_token = torch.empty(1, dtype=torch.int64, device=CUDA)
    position = torch.tensor([1000], dtype=torch.int64, device=CUDA)
    pointers = pick.pointers(token, logprob, device_token, position)
    assert pointers is not None
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        packed.norm(h, nw, EPS, cfg, pick=pointers)  # warm: compiles and loads first
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        logits = packed.norm(h, nw, EPS, cfg, pick=pointers)
    position.fill_(1000)
    for rep in range(5):
        fresh, _ = _inputs(k, torch.float16, 100 + rep)
        h.copy_(fresh)
        token.fill_(-1)
        logprob.fill_(math.nan)
        torch.cuda.synchronize()
        with torch.cuda.stream(stream):
            graph.replay()
        stream.synchronize()
        want = packed.norm(h, nw, EPS, cfg)
        torch.cuda.synchronize()
        assert torch.equal(logits, want), f"replay {rep}: logits"
        want_token, _ = _check(token, logprob, want, f"replay {rep}")
        assert int(device_token[0]) == want_token
        assert int(position[0]) == 1001 + rep, "the position must move on by one per replay"
        assert not pick.counter.any()


# -- through the graph runner -----------------------------------------------------------

PROMPT = list(b"def fibonacci(n):\n    if n < 2:\n        return n\n")


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def runners(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    from nib.engine.graphs import GraphRunner
    from nib.engine.loader import load_model
    from nib.engine.ops import TritonOps
    from nib.engine.startup import swap_in_linear_kernels

    folder = save_random_hf_model(request.param, tmp_path_factory.mktemp(request.param))
    model = load_model(folder, quant="int4", dtype=torch.float16, device="cuda")
    model.setup_cache(512)
    model.ops = TritonOps()
    swap_in_linear_kernels(model, CUDA, tune=False)
    assert model.output.cuda is not None, "the lm_head must run nib's CUDA INT4 kernel"
    fused = GraphRunner(model, 512, buckets=(64, 512))
    separate = GraphRunner(model, 512, buckets=(64, 512))
    assert fused.pick_fusable() and not fused.fuse_pick  # off unless the step tuning says
    fused.fuse_pick = True
    for r in (fused, separate):
        r.capture()
        assert all(s.ready for s in r.states.values()), [
            (s.name, s.error) for s in r.states.values() if not s.ready
        ]
    assert fused.pick_fused and not separate.pick_fused
    return model, fused, separate


def test_runner_greedy_decoding_equals_the_separate_pick(runners) -> None:  # type: ignore[no-untyped-def]
    _, fused, separate = runners
    for prompt in (PROMPT, PROMPT[:5], PROMPT * 4):
        a = list(fused.generate(prompt, True, 64))
        b = list(separate.generate(prompt, True, 64))
        assert len(a) == len(b) == 64
        assert [t for t, _ in a] == [t for t, _ in b]
        torch.testing.assert_close(
            torch.tensor([p for _, p in a]), torch.tensor([p for _, p in b]), atol=ATOL, rtol=RTOL
        )


def test_kernel_paths_name_the_fused_pick(runners) -> None:  # type: ignore[no-untyped-def]
    from nib.engine.kernel_paths import PICK_FUSED, gpu_paths

    model, fused, separate = runners
    greedy = [(p.kernel, p.graphs) for p in gpu_paths(model, fused) if p.op == "sampling.greedy"]
    assert greedy[0] == (PICK_FUSED, "decode-greedy"), greedy
    assert all(p.kernel != PICK_FUSED for p in gpu_paths(model, separate))


def test_the_self_check_case_passes_and_catches_a_wrong_token(runners) -> None:  # type: ignore[no-untyped-def]
    """With the pick fused (what start-up checks then: build_cases(fused_pick=True)), the
    case runs the model's own lm_head; a tampered token fails it."""
    from nib.engine.kernel_paths import PICK_FUSED
    from nib.engine.selfcheck import run_self_check
    from nib.engine.selfcheck_cases import CaseBuilder

    model, fused, _ = runners
    builder = CaseBuilder(model, (1,), fused.attention, None, None, fused_pick=True)
    cases = list(builder._fused_pick())
    assert len(cases) == 1 and cases[0].path() == PICK_FUSED
    report = run_self_check(cases)
    assert all(c.passed for c in report.checks), report.summary()
    case = cases[0]
    out = case.run(case.inputs())
    want = case.reference(case.inputs())
    assert case.compare is not None and case.compare(out, want)[0] <= case.tolerance
    wrong = (out[0] + 1, *out[1:])
    assert case.compare(wrong, want)[0] == math.inf
    assert not list(CaseBuilder(model, (1,), fused.attention, None, None)._fused_pick())
