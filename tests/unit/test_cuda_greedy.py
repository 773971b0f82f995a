"""The greedy kernel (engine/cuda/greedy.cu) checked on the CPU.

- it compiles for sm_90 and sm_80 without spills or a stack frame (skipped, with the
  reason, where nvcc is missing);
- the Python argument struct and constants match the .cu file's;
- a Python model of the kernel, written loop for loop like greedy.cu (the blocks'
  slices of 16-byte vectors, each thread's trips, the unaligned head and tail that
  block 0 reads, the warp butterflies, the last block's merge), visits every element
  exactly once and gives torch.argmax's token (ties: the first index; NaN first;
  an all -inf choice: 0) and torch's log-probability, for rows that start anywhere;
- the wrapper rejects what the kernel cannot take, naming the rule.
"""

from __future__ import annotations

import ctypes
import math
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from nib.engine.cuda import build
from nib.engine.cuda.greedy import (
    MAX_BLOCKS,
    PARTIAL_FLOATS,
    PICK_GROUP,
    THREADS,
    VECTORS_PER_THREAD,
    GreedyArgs,
    blocks_for,
    check_call,
)
from nib.engine.kernel_paths import _greedy_kernel
from tests.unit.cuda_tools import nvcc_or_skip

SOURCE = Path(build.HERE) / "greedy.cu"
KERNEL_NAMES = {f"greedy_{d}{b}" for d in ("f32", "f16", "bf16") for b in ("", "_bias")}
NONE = 0x7FFFFFFF
WARPS = THREADS // 32


@pytest.mark.parametrize("target", ["sm_90", "sm_80"])
def test_every_kernel_compiles_without_spills(target: str) -> None:
    nvcc_or_skip()
    report = {r.kernel: r for r in build.resources("greedy.cu", target)}
    assert set(report) == KERNEL_NAMES
    for r in report.values():
        assert r.spill_stores == 0 and r.spill_loads == 0 and r.stack_bytes == 0, r
        assert r.registers <= 64, r  # 256 threads: several blocks fit an SM with room to spare


def test_struct_and_constants_match_the_source() -> None:
    text = SOURCE.read_text()
    body = re.search(r"struct GreedyArgs \{(.*?)\};", text, re.S)
    assert body is not None
    names = re.findall(r"(\w+);", re.sub(r"//.*", "", body[1]))
    assert names == [name for name, _ in GreedyArgs._fields_]
    # 8 pointers, a long long, two ints: the C layout.
    assert GreedyArgs.row_stride.offset == 64 and GreedyArgs.vocab.offset == 72
    assert GreedyArgs.sys_fence.offset == 76 and ctypes.sizeof(GreedyArgs) == 80
    assert f"constexpr int THREADS = {THREADS};" in text
    assert f"constexpr int VPT = {VECTORS_PER_THREAD};" in text
    pick = (SOURCE.parent / "pick.cuh").read_text()  # the partials' stride in the workspace
    assert f"constexpr int PICK_PARTIAL_FLOATS = {PARTIAL_FLOATS};" in pick
    w4 = (SOURCE.parent / "w4a16.cu").read_text()  # the fused pick's groups
    assert f"constexpr int PICK_GROUP = {PICK_GROUP};" in w4


def test_blocks_per_row() -> None:
    assert blocks_for(151936, torch.bfloat16) == 38  # 18992 vectors / 512 per block
    assert blocks_for(32000, torch.float16) == 8
    assert blocks_for(151936, torch.float32) == 75
    assert blocks_for(8192, torch.bfloat16) == 2
    assert blocks_for(7, torch.bfloat16) == 1  # no whole vector: block 0 reads it all
    assert blocks_for(10**7, torch.float32) == MAX_BLOCKS  # beyond, the threads loop


# -- a model of greedy.cu --------------------------------------------------------------


def _fmax(a: float, b: float) -> float:
    """fmaxf: a NaN operand loses."""
    if math.isnan(a):
        return b
    return a if math.isnan(b) else max(a, b)


def _ref_of(m: float) -> float:
    return 0.0 if m == -math.inf else m


def _exp(x: float) -> float:
    """ex2.approx(x * log2 e): 0 for -inf, NaN for NaN."""
    if math.isnan(x):
        return math.nan
    return 0.0 if x == -math.inf else math.exp(x)


def _empty() -> list:
    return [-math.inf, NONE, 0.0, -math.inf, 0.0]  # c, i, x, m, s


def _take(b: list, c: float, x: float, i: int) -> None:
    if c > b[0] or (math.isnan(c) and not math.isnan(b[0])):
        b[0], b[1], b[2] = c, i, x


def _before(ac: float, ai: int, bc: float, bi: int) -> bool:
    if math.isnan(ac):
        return not math.isnan(bc) or ai < bi
    if math.isnan(bc):
        return False
    return ac > bc or (ac == bc and ai < bi)


def _merge(a: list, b: list) -> list:
    first = _before(a[0], a[1], b[0], b[1])
    c, i, x = (a if first else b)[:3]
    m = _fmax(a[3], b[3])
    ref = _ref_of(m)
    s = a[4] * _exp(a[3] - ref) + b[4] * _exp(b[3] - ref)
    return [c, i, x, m, s]


def _warp_merge(lanes: list[list]) -> list[list]:
    for o in (16, 8, 4, 2, 1):
        lanes = [_merge(lanes[lane], lanes[lane ^ o]) for lane in range(32)]
    return lanes


def _block_merge(threads: list[list]) -> list:
    scratch = [_warp_merge(threads[w * 32 : (w + 1) * 32])[0] for w in range(WARPS)]
    warp0 = [scratch[lane] if lane < WARPS else _empty() for lane in range(32)]
    return _warp_merge(warp0)[0]


def simulate(
    row: torch.Tensor, bias: torch.Tensor | None, blocks: int, misalign: int
) -> tuple[int, float, list[int]]:
    """(token, logprob, every element index visited) for one row whose first element
    sits `misalign` bytes past a 16-byte boundary; row is the fp32 value of each
    element (as the kernel converts it), bias the fp32 bias."""
    esize = 4 if row.dtype == torch.float32 else 2
    epv = 16 // esize
    x_all = row.float().tolist()
    b_all = None if bias is None else bias.tolist()
    # c = x + bias in fp32, as the kernel's FADD
    c_all = x_all if bias is None else (row.float() + bias).tolist()
    vocab = len(x_all)
    head = min(vocab, ((16 - misalign) & 15) // esize)
    nvec = (vocab - head) // epv
    tail = head + nvec * epv
    per = -(-nvec // blocks)
    visited: list[int] = []
    partials = []
    for blk in range(blocks):
        v0, v1 = blk * per, min(nvec, blk * per + per)
        threads = []
        for tid in range(THREADS):
            b = _empty()
            v = v0 + tid
            while v < v1:
                for j in range(VECTORS_PER_THREAD):
                    vj = v + j * THREADS
                    if vj >= v1:
                        break
                    i0 = head + vj * epv
                    xs = x_all[i0 : i0 + epv]
                    vm = xs[0]
                    for x in xs[1:]:
                        vm = _fmax(vm, x)
                    m = _fmax(b[3], vm)
                    ref = _ref_of(m)
                    s = b[4] * _exp(b[3] - ref)
                    for e, x in enumerate(xs):
                        s += _exp(x - ref)
                        _take(b, c_all[i0 + e], x, i0 + e)
                        visited.append(i0 + e)
                    b[3], b[4] = m, s
                v += THREADS * VECTORS_PER_THREAD
            if blk == 0 and tid < head + (vocab - tail):
                i = tid if tid < head else tail + tid - head
                x = x_all[i]
                one = _empty()
                one[3], one[4] = x, _exp(x - _ref_of(x))
                _take(one, x if b_all is None else c_all[i], x, i)
                b = _merge(b, one)
                visited.append(i)
            threads.append(b)
        partials.append(_block_merge(threads))
    last = [_empty() for _ in range(THREADS)]
    for p, part in enumerate(partials):  # thread p % THREADS merges partial p
        last[p % THREADS] = _merge(last[p % THREADS], part)
    b = _block_merge(last)
    token, x = b[1], b[2]
    if token == NONE:
        token, x = 0, x_all[0]
    logprob = x - (_ref_of(b[3]) + (math.log(b[4]) if b[4] > 0 else -math.inf))
    return token, logprob, visited


def _torch(row: torch.Tensor, bias: torch.Tensor | None) -> tuple[int, float]:
    r = row.float()
    choose = r if bias is None else r + bias
    token = int(choose.argmax())
    return token, float(r[token] - r.logsumexp(0))


def _row(vocab: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(vocab, generator=g) * 3).to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("vocab", [1, 2, 7, 13, 300, 1003])
def test_every_element_is_visited_once(vocab: int, dtype: torch.dtype) -> None:
    esize = 4 if dtype == torch.float32 else 2
    for misalign in range(0, 16, esize * 3 if esize == 2 else esize):
        for blocks in {1, 3, blocks_for(vocab, dtype)}:
            _, _, visited = simulate(_row(vocab, dtype, vocab), None, blocks, misalign)
            assert sorted(visited) == list(range(vocab)), (vocab, misalign, blocks)


def _check(row: torch.Tensor, bias: torch.Tensor | None, blocks: int, misalign: int) -> None:
    token, logprob, _ = simulate(row, bias, blocks, misalign)
    want_token, want_logprob = _torch(row, bias)
    assert token == want_token
    if math.isnan(want_logprob):
        assert math.isnan(logprob)
    else:
        assert logprob == pytest.approx(want_logprob, abs=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_model_matches_torch_with_ties_and_bias(dtype: torch.dtype) -> None:
    vocab = 2053
    for seed in range(3):
        row = _row(vocab, dtype, seed)
        g = torch.Generator().manual_seed(100 + seed)
        a, b, c = sorted(torch.randperm(vocab, generator=g)[:3].tolist())
        row[[a, b, c]] = (row.float().max() + 1).to(dtype)  # a tie across threads and blocks
        bias = torch.randn(vocab, generator=g) * 0.1
        bias[torch.rand(vocab, generator=g) < 0.2] = -math.inf
        bias[[b, c]] = 0.0
        for misalign in (0, 2 if dtype != torch.float32 else 4, 12):
            for blocks in (1, 4):
                _check(row, None, blocks, misalign)  # a wins
                bias[a] = -math.inf
                _check(row, bias, blocks, misalign)  # then b
                bias[a] = 0.0


def test_model_matches_torch_at_the_edges() -> None:
    vocab = 517
    row = _row(vocab, torch.bfloat16, 7)
    everything_out = torch.full((vocab,), -math.inf)
    _check(row, everything_out, 2, 0)  # every choice -inf: token 0, as torch.argmax
    one_left = everything_out.clone()
    one_left[vocab - 1] = 0.0  # the last element: in the tail
    _check(row, one_left, 2, 6)
    with_nan = row.clone()
    with_nan[[40, 300]] = math.nan  # the first NaN wins, the log-probability is NaN
    _check(with_nan, None, 2, 0)
    minus_inf = row.clone()
    minus_inf[: vocab // 2] = -math.inf  # -inf logits add nothing to the sum
    _check(minus_inf, None, 3, 2)
    equal = torch.zeros(vocab, dtype=torch.bfloat16)  # all tied: index 0
    _check(equal, None, 2, 4)


# -- the wrapper's door ----------------------------------------------------------------


def _call(**kw: object) -> None:
    cpu = torch.device("cpu")
    args: dict[str, object] = {
        "logits": torch.zeros(2, 64, dtype=torch.bfloat16),
        "bias": None,
        "token": None,
        "out_token": torch.zeros(2, dtype=torch.int64),
        "out_logprob": torch.zeros(2),
    }
    args.update(kw)
    check_call(64, 8, cpu, **args)  # type: ignore[arg-type]


def test_the_wrapper_names_the_rule() -> None:
    _call()
    with pytest.raises(ValueError, match="fp32, fp16 or bf16"):
        _call(logits=torch.zeros(2, 64, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"\[1\.\.8, 64\]"):
        _call(logits=torch.zeros(9, 64, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r"\[1\.\.8, 64\]"):
        _call(logits=torch.zeros(2, 63, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="unit stride"):
        _call(logits=torch.zeros(64, 2, dtype=torch.bfloat16).t())
    with pytest.raises(ValueError, match="bias must be"):
        _call(bias=torch.zeros(64, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="out_token must be"):
        _call(out_token=torch.zeros(1, dtype=torch.int64))
    with pytest.raises(ValueError, match="out_logprob must be"):
        _call(out_logprob=torch.zeros(2, dtype=torch.float16))
    _call(advance=torch.zeros(1, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"advance must be a contiguous torch.int64 tensor of 1"):
        _call(advance=torch.zeros(1, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"advance must be a contiguous torch.int64 tensor of 1"):
        _call(advance=torch.zeros(2, dtype=torch.int64))


def test_kernel_paths_name_the_greedy_kernel() -> None:
    assert _greedy_kernel(SimpleNamespace()) == "torch argmax"  # type: ignore[arg-type]
    assert _greedy_kernel(SimpleNamespace(greedy=None)) == "torch argmax"  # type: ignore[arg-type]
    runner = SimpleNamespace(greedy=SimpleNamespace(label="cuda greedy argmax+logprob"))
    assert _greedy_kernel(runner) == "cuda greedy argmax+logprob"  # type: ignore[arg-type]


def test_kernel_paths_name_the_fused_pick_where_the_decode_graphs_ran_it() -> None:
    from nib.engine.kernel_paths import PICK_FUSED, _greedy_paths

    greedy = SimpleNamespace(label="cuda greedy argmax+logprob")
    apart = _greedy_paths(SimpleNamespace(greedy=greedy, pick_fused=False))  # type: ignore[arg-type]
    assert [(p.kernel, p.graphs) for p in apart] == [(greedy.label, "*-greedy; verify")]
    fused = _greedy_paths(SimpleNamespace(greedy=greedy, pick_fused=True))  # type: ignore[arg-type]
    assert [(p.kernel, p.graphs) for p in fused] == [
        (PICK_FUSED, "decode-greedy"),
        (greedy.label, "prefill/chunk-greedy; verify"),
    ]


def test_the_self_check_case_plants_ties_and_catches_a_wrong_token() -> None:
    from nib.engine.selfcheck_cases import (
        GREEDY_POSITION,
        _check_greedy,
        _greedy_inputs,
        _greedy_ref,
    )

    cpu = torch.device("cpu")
    plain = _greedy_inputs(1000, 4, False, torch.bfloat16, cpu, 3)
    tokens, logprobs, pos = _greedy_ref(plain)
    assert int(pos[0]) == GREEDY_POSITION + 1  # the decode position, advanced once
    for r in range(4):  # the planted maximum appears three times; torch takes the first
        where = (plain["logits"][r] == plain["logits"][r].max()).nonzero()[:, 0]
        assert len(where) >= 3 and int(tokens[r]) == int(where[0])
    biased = _greedy_inputs(1000, 1, True, torch.bfloat16, cpu, 3)
    token, _, _ = _greedy_ref(biased)
    where = (biased["logits"][0] == biased["logits"][0].max()).nonzero()[:, 0]
    assert int(token[0]) == int(where[1])  # the first is masked by the bias: the second
    want = (tokens, logprobs, pos)
    assert _check_greedy(want, want) == (0.0, "")
    wrong = tokens.clone()
    wrong[2] += 1
    error, why = _check_greedy((wrong, logprobs, pos), want)
    assert math.isinf(error) and why.startswith("row 2:")
    error, why = _check_greedy((tokens, logprobs + 1e-3, pos), want)
    assert error == pytest.approx(1e-3, rel=1e-3) and not why
    for stuck in (pos - 1, pos + 1):  # not advanced, or twice
        error, why = _check_greedy((tokens, logprobs, stuck), want)
        assert math.isinf(error) and "not + 1" in why
