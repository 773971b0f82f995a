"""The decode graph's embedding kernel (engine/cuda/embed.cu) on the GPU.

Rows of fresh random tables (bf16 and fp16, the two shipped shapes' hidden sizes and
a small one) at random tokens and both ends of the vocabulary, into outputs poisoned
with NaN: every element must be the table's, exactly. A token outside the vocabulary
gives a zero row and leaves the others right. In a CUDA graph, behind the greedy
kernel that writes the token it reads (both launched with programmatic dependent
launch, so the embedding starts before the greedy pick has ended and must wait for
it): the row of the token just picked, replay after replay.
"""

from __future__ import annotations

import pytest
import torch

from nib.engine.cuda.embed import CudaEmbedding
from nib.engine.cuda.greedy import CudaGreedy

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")


@pytest.fixture(scope="module")
def kernels() -> None:
    from nib.engine.cuda import loader

    why = loader.unavailable_reason(CUDA)
    if why:
        pytest.skip(f"nib's CUDA kernels are unavailable here: {why}")


def table_of(vocab: int, hidden: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator(device=CUDA).manual_seed(seed)
    return torch.randn(vocab, hidden, device=CUDA, generator=g).to(dtype)


@pytest.mark.parametrize("rows", [1, 7])
@pytest.mark.parametrize(("vocab", "hidden"), [(32000, 4096), (151936, 1536), (1003, 8)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_rows_are_the_tables_exactly(
    kernels: None, dtype: torch.dtype, vocab: int, hidden: int, rows: int
) -> None:
    table = table_of(vocab, hidden, dtype, vocab + rows)
    embed = CudaEmbedding(table)
    g = torch.Generator(device=CUDA).manual_seed(rows)
    tokens = torch.randint(0, vocab, (1, rows), device=CUDA, generator=g)
    tokens[0, 0] = vocab - 1
    if rows > 1:
        tokens[0, 1] = 0
    out = torch.full((1, rows, hidden), float("nan"), dtype=dtype, device=CUDA)
    embed(tokens, out=out)
    torch.cuda.synchronize()
    assert torch.equal(out, torch.nn.functional.embedding(tokens, table))


def test_a_token_outside_the_vocabulary_gives_a_zero_row(kernels: None) -> None:
    table = table_of(1000, 64, torch.bfloat16, 1)
    embed = CudaEmbedding(table)
    tokens = torch.tensor([[3, -1, 1000, 999]], device=CUDA)
    out = embed(tokens)
    torch.cuda.synchronize()
    assert torch.equal(out[0, 0], table[3]) and torch.equal(out[0, 3], table[999])
    assert not out[0, 1].any() and not out[0, 2].any()


def test_behind_the_greedy_pick_in_a_graph_it_reads_the_token_just_written(kernels: None) -> None:
    vocab, hidden = 32000, 4096
    table = table_of(vocab, hidden, torch.bfloat16, 7)
    embed = CudaEmbedding(table)
    greedy = CudaGreedy(vocab, 1, CUDA)
    logits = torch.zeros(1, vocab, dtype=torch.bfloat16, device=CUDA)
    token = torch.zeros(1, 1, dtype=torch.int64, device=CUDA)
    out_token = torch.zeros(1, dtype=torch.int64, device=CUDA)
    out_logprob = torch.zeros(1, device=CUDA)
    pos = torch.zeros(1, dtype=torch.int64, device=CUDA)
    row = torch.empty(1, 1, hidden, dtype=torch.bfloat16, device=CUDA)
    stream = torch.cuda.Stream()

    def body() -> None:
        greedy.run(logits, out_token, out_logprob, token=token.view(1), advance=pos)
        embed(token, out=row)

    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        body()
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        body()
    g = torch.Generator(device=CUDA).manual_seed(0)
    for rep in range(6):
        fresh = torch.randn(1, vocab, device=CUDA, generator=g).to(torch.bfloat16)
        logits.copy_(fresh)
        row.fill_(float("nan"))
        pos.fill_(100)
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            graph.replay()
        stream.synchronize()
        want = int(fresh.float().argmax())
        assert int(token) == want, rep
        assert torch.equal(row[0, 0], table[want]), rep
        assert int(pos) == 101, rep  # the pick advanced the position once
