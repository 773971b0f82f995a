"""The greedy kernel (engine/cuda/greedy.cu) on the GPU, against torch.argmax / logsumexp.

Fresh random logits for every launch (scale 3, the maximum planted at three places
of every row: the first must win; with a bias, -inf on a tenth of the vocabulary
and on the first of the three, so the second must), vocabularies 8192, 32000,
151936 and an odd 1003, bf16/fp16/fp32, one row and the verify graph's eight,
rows that start off a 16-byte boundary. Outputs go to pinned host memory poisoned
before each launch (-1, NaN) and are read after an event, as the engine reads
them; the token must equal torch's and the log-probability be within 1e-4. The
same inside a CUDA graph replayed with new logits (advancing a decode position by
one per launch), and through the GraphRunner (greedy decoding, token healing,
verification) against its PyTorch path, whose decode graphs also look the token up
with PyTorch's embedding instead of engine/cuda/embed.cu.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from nib.engine.cuda.greedy import CudaGreedy

from .models import save_random_hf_model

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")
VOCABS = (8192, 32000, 151936, 1003)
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
ATOL, RTOL = 1e-4, 1e-5


@pytest.fixture(scope="module")
def kernels() -> None:
    from nib.engine.cuda import loader

    why = loader.unavailable_reason(CUDA)
    if why:
        pytest.skip(f"nib's CUDA kernels are unavailable here: {why}")


def make_logits(
    rows: int, vocab: int, dtype: torch.dtype, seed: int, biased: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    g = torch.Generator(device=CUDA).manual_seed(seed)
    logits = (torch.randn(rows, vocab, device=CUDA, generator=g) * 3).to(dtype)
    top = (logits.float().amax(dim=1) + 1).to(dtype)
    bias = None
    if biased:
        bias = torch.randn(vocab, device=CUDA, generator=g) * 0.1
        bias[torch.rand(vocab, device=CUDA, generator=g) < 0.1] = -math.inf
    for r in range(rows):
        a, b, c = torch.randperm(vocab, device=CUDA, generator=g)[:3].sort().values.tolist()
        logits[r, [a, b, c]] = top[r]
        if bias is not None:
            bias[[b, c]] = 0.0
            bias[a] = -math.inf
    return logits, bias


def reference(logits: torch.Tensor, bias: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    row = logits.float()
    choose = row if bias is None else row + bias
    token = choose.argmax(dim=-1)
    logprob = row.gather(1, token[:, None])[:, 0] - row.logsumexp(dim=-1)
    return token.cpu(), logprob.cpu()


def pinned(rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    token = torch.full((rows,), -1, dtype=torch.int64).pin_memory()
    return token, torch.full((rows,), math.nan).pin_memory()


def after_event() -> None:
    """What the engine does before reading a slot: an event behind the work, waited on."""
    event = torch.cuda.Event()
    event.record()
    event.synchronize()


def check(
    token: torch.Tensor,
    logprob: torch.Tensor,
    want: tuple[torch.Tensor, torch.Tensor],
    what: str,
) -> None:
    want_token, want_logprob = want
    assert (token >= 0).all(), f"{what}: a token was not written"
    assert torch.equal(token.cpu(), want_token), (
        f"{what}: {token.tolist()} != {want_token.tolist()}"
    )
    assert torch.isfinite(logprob).all(), f"{what}: a log-probability was not written"
    torch.testing.assert_close(logprob.cpu(), want_logprob, atol=ATOL, rtol=RTOL, msg=what)


@pytest.mark.parametrize("biased", [False, True], ids=["plain", "bias"])
@pytest.mark.parametrize("rows", [1, 8])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("vocab", VOCABS)
def test_matches_torch(
    kernels: None, vocab: int, dtype: torch.dtype, rows: int, biased: bool
) -> None:
    greedy = CudaGreedy(vocab, 8, CUDA)
    device_token = torch.empty(rows, dtype=torch.int64, device=CUDA)
    for seed in range(3):  # repeated launches: the counters must have reset themselves
        logits, bias = make_logits(rows, vocab, dtype, 1000 * vocab + seed, biased)
        token, logprob = pinned(rows)
        device_token.fill_(-1)
        greedy.run(logits, token, logprob, bias, device_token)
        after_event()
        want = reference(logits, bias)
        what = f"vocab={vocab} {dtype} rows={rows} bias={biased} seed={seed}"
        check(token, logprob, want, what)
        assert torch.equal(device_token.cpu(), want[0]), what
    assert not greedy.counters.any()


def test_pinned_outputs_are_stored_by_the_kernel(kernels: None) -> None:
    """On the H200 the driver maps PyTorch's pinned memory: no copy fallback."""
    greedy = CudaGreedy(4096, 1, CUDA)
    logits, _ = make_logits(1, 4096, torch.bfloat16, 9, False)
    token, logprob = pinned(1)
    greedy.run(logits, token, logprob)
    after_event()
    check(token, logprob, reference(logits, None), "mapped")
    assert greedy.maps_host, "the driver did not map pinned memory: the copy fallback ran"
    assert greedy.label == "cuda greedy argmax+logprob"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_rows_off_the_16_byte_boundary(kernels: None, dtype: torch.dtype) -> None:
    vocab, rows = 32000, 5
    greedy = CudaGreedy(vocab, 8, CUDA)
    for offset in (1, 3, 6):
        logits, _ = make_logits(rows, vocab + 7, dtype, offset, False)
        view = logits[:, offset : offset + vocab]  # stride vocab + 7: each row starts elsewhere
        token, logprob = pinned(rows)
        greedy.run(view, token, logprob)
        after_event()
        check(token, logprob, reference(view, None), f"offset={offset}")
        one = logits[2, offset : offset + vocab]  # one row, 1-D
        token, logprob = pinned(1)
        greedy.run(one, token, logprob)
        after_event()
        check(token, logprob, reference(one[None], None), f"1-D offset={offset}")


def test_edges(kernels: None) -> None:
    vocab = 151936
    greedy = CudaGreedy(vocab, 8, CUDA)
    logits, _ = make_logits(1, vocab, torch.bfloat16, 5, False)
    # every choice -inf: torch.argmax says 0
    nothing = torch.full((vocab,), -math.inf, device=CUDA)
    token, logprob = pinned(1)
    greedy.run(logits, token, logprob, nothing)
    after_event()
    check(token, logprob, reference(logits, nothing), "all -inf")
    # one allowed token, in the unaligned tail of an odd vocabulary
    odd = 1003
    small = CudaGreedy(odd, 1, CUDA)
    row, _ = make_logits(1, odd, torch.float16, 6, False)
    only = torch.full((odd,), -math.inf, device=CUDA)
    only[odd - 1] = 0.0
    token, logprob = pinned(1)
    small.run(row, token, logprob, only)
    after_event()
    assert int(token[0]) == odd - 1
    check(token, logprob, reference(row, only), "last token only")
    # -inf logits add nothing to the log-sum-exp
    half = logits.clone()
    half[0, : vocab // 2] = -math.inf
    token, logprob = pinned(1)
    greedy.run(half, token, logprob)
    after_event()
    check(token, logprob, reference(half, None), "-inf logits")
    # a NaN is the maximum, the first one wins (the log-probability is NaN, as torch's)
    nan = logits.clone()
    nan[0, [77777, 123]] = math.nan
    token, logprob = pinned(1)
    greedy.run(nan, token, logprob)
    after_event()
    want_token, _ = reference(nan, None)
    assert int(token[0]) == int(want_token[0]) == 123
    assert math.isnan(float(logprob[0]))


def _graph_has_memcpy(graph: torch.cuda.CUDAGraph, tmp: Path) -> bool | None:
    """Whether the captured graph holds a copy node (None: the dump is unreadable here)."""
    try:
        path = tmp / "graph.dot"
        graph.debug_dump(str(path))
        text = path.read_text().lower()
    except Exception:  # a debugging aid of torch's: without it the test goes on
        return None
    return "memcpy" in text if "kernel" in text else None


@pytest.mark.parametrize("fence", [True, False], ids=["sys-fence", "no-fence"])
@pytest.mark.parametrize("rows", [1, 4])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
def test_in_a_cuda_graph(
    kernels: None, dtype: torch.dtype, rows: int, fence: bool, tmp_path: Path
) -> None:
    vocab = 151936
    greedy = CudaGreedy(vocab, 8, CUDA, sys_fence=fence)
    static = torch.zeros(rows, vocab, dtype=dtype, device=CUDA)
    bias = torch.zeros(vocab, device=CUDA)
    slots, slot_logprobs = pinned(rows + 2)  # like the runner's slots: this graph writes 1..rows
    device_token = torch.zeros(rows, dtype=torch.int64, device=CUDA)
    position = torch.zeros(1, dtype=torch.int64, device=CUDA)  # advanced once per launch
    stream = torch.cuda.Stream()

    def body() -> None:
        b = bias if rows == 1 else None
        greedy.run(
            static, slots[1 : 1 + rows], slot_logprobs[1 : 1 + rows], b, device_token, position
        )

    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        body()  # warm-up, as the runner's: resolves the pinned mapping before capture
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    graph.enable_debug_mode()
    with torch.cuda.graph(graph, stream=stream):
        body()
    position.fill_(1000)
    for rep in range(5):
        logits, new_bias = make_logits(rows, vocab, dtype, 77 + rep, rows == 1)
        static.copy_(logits)
        if new_bias is not None:
            bias.copy_(new_bias)
        slots.fill_(-1)
        slot_logprobs.fill_(math.nan)
        device_token.fill_(-1)
        stream.wait_stream(torch.cuda.current_stream())
        event = torch.cuda.Event()
        with torch.cuda.stream(stream):
            graph.replay()
            event.record(stream)
        event.synchronize()
        want = reference(logits, new_bias)
        what = f"{dtype} rows={rows} replay {rep}"
        check(slots[1 : 1 + rows], slot_logprobs[1 : 1 + rows], want, what)
        assert torch.equal(device_token.cpu(), want[0]), what
        for outside in (0, rows + 1):
            assert int(slots[outside]) == -1, "wrote outside its slots"
            assert math.isnan(float(slot_logprobs[outside])), "wrote outside its slots"
        assert not greedy.counters.any(), "a counter was left set"
        assert int(position) == 1001 + rep, "the position must move on by one per launch"
    if greedy.maps_host:
        assert _graph_has_memcpy(graph, tmp_path) is not True, "pinned outputs still copied"


# -- through the graph runner -----------------------------------------------------------

PROMPT = list(b"def fibonacci(n):\n    if n < 2:\n        return n\n")


@pytest.fixture(scope="module")
def runners(kernels: None, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    from nib.engine.graphs import GraphRunner
    from nib.engine.loader import load_model
    from nib.engine.ops import TritonOps

    folder = save_random_hf_model("qwen2", tmp_path_factory.mktemp("greedy-qwen2"))
    model = load_model(folder, dtype=torch.bfloat16, device="cuda")
    model.setup_cache(512)
    model.ops = TritonOps()
    cuda_runner = GraphRunner(model, 512, buckets=(64, 512))
    torch_runner = GraphRunner(model, 512, buckets=(64, 512))
    torch_runner.greedy = None  # the PyTorch sequence, captured the same way
    torch_runner.embed = None  # and PyTorch's embedding (decode graphs)
    assert cuda_runner.greedy is not None and cuda_runner.embed is not None
    for r in (cuda_runner, torch_runner):
        r.capture()
        assert all(s.ready for s in r.states.values()), [
            (s.name, s.error) for s in r.states.values() if not s.ready
        ]
    return cuda_runner, torch_runner


def test_runner_greedy_decoding_equals_the_torch_path(runners) -> None:  # type: ignore[no-untyped-def]
    cuda_runner, torch_runner = runners
    for prompt in (PROMPT, PROMPT[:5], PROMPT * 4):
        a = list(cuda_runner.generate(prompt, True, 48))
        b = list(torch_runner.generate(prompt, True, 48))
        assert [t for t, _ in a] == [t for t, _ in b]
        torch.testing.assert_close(
            torch.tensor([p for _, p in a]), torch.tensor([p for _, p in b]), atol=ATOL, rtol=RTOL
        )
    assert cuda_runner.greedy.label.startswith("cuda greedy argmax+logprob")
    assert torch_runner.greedy is None


def test_runner_token_healing_and_verify_equal_the_torch_path(runners) -> None:  # type: ignore[no-untyped-def]
    cuda_runner, torch_runner = runners
    vocab = cuda_runner.model.cfg.vocab_size
    bias = torch.zeros(vocab, device=CUDA)
    bias[: vocab // 2] = -math.inf  # healing: only the upper half may come first
    results = []
    for r in (cuda_runner, torch_runner):
        r.set_first_bias(bias)
        r.prefill(PROMPT, True).synchronize()
        first = r.read(2)
        r.set_first_bias(None)
        r.launch_verify([first[0], 10, 20, 30], len(PROMPT)).synchronize()
        rows, logprobs = r.read_verify(4)
        results.append((first, rows, logprobs))
    (first_a, rows_a, lp_a), (first_b, rows_b, lp_b) = results
    assert first_a[0] == first_b[0] >= vocab // 2
    assert first_a[1] == pytest.approx(first_b[1], abs=ATOL)
    assert rows_a == rows_b
    assert lp_a == pytest.approx(lp_b, abs=ATOL)
