"""The self-check's cases for one model: each kernel path the GPU engine runs, at the
shapes it runs them, against the PyTorch reference (see selfcheck.py).

- the fused glue (rms_norm, add_rms_norm, rope_cache, silu_mul) on the model's
  own norm weights and RoPE tables, at one row and at several;
- every linear shape at every class of row counts that picks a different kernel
  (the tuned GEMV or cuBLAS for 16-bit weights; the INT4 GEMV / MMA / dequant
  path, after any fallback on this GPU), with the layer's real weights;
- decode attention (one query, the whole context), the fused CUDA RoPE + KV-write +
  attention of the decode graph where it runs, its multi-query form (the chunk and
  verify graphs) and the prefill attention;
- sampling: the Philox exponential noise (seeded, exponential), the whole
  device sampler against a reference race run with the same noise, and (where
  nib's CUDA kernels run) the greedy kernel's argmax and log-probability against
  torch.argmax / logsumexp, with planted ties and -inf biases, into pinned memory,
  and its advance of the decode position;
- the decode graph's CUDA embedding lookup, exactly, where it runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from functools import partial
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from nib.engine.cuda.embed import cuda_embedding
from nib.engine.cuda.greedy import CudaGreedy, FusedPick, cuda_greedy
from nib.engine.device_sampling import DeviceSampler
from nib.engine.kernel_paths import (
    HEAD,
    PICK_FUSED,
    is_gemv,
    linear_kernel,
    linears,
    row_classes,
)
from nib.engine.kernels import reference as ref
from nib.engine.kernels.decode_attention import DecodeAttention
from nib.engine.kv_cache import KVCache
from nib.engine.model import Transformer
from nib.engine.ops import TorchOps, fresh_prefill_attention
from nib.engine.quant.linear import Int4Linear
from nib.engine.selfcheck import Case, Inputs, Outputs

if TYPE_CHECKING:
    from nib.engine.cuda.attention import FusedDecodeAttention

# Twice what the kernel tests accept (tests/unit/test_kernels.py, tests/gpu): random
# shapes of a real model, not a sweep tuned to pass. A wrong layout is off by ~1.
TOLERANCE = {torch.float32: 1e-4, torch.float16: 4e-3, torch.bfloat16: 2e-2}
INT4_TOLERANCE = 5e-3  # its fp16 output against the fp32 reference (tests: 1e-3)
NOISE_SAMPLES = 1 << 16
GREEDY_TOLERANCE = 5e-4  # log-probability, absolute (tests: 1e-4); tokens must be equal
LARGEST_CHECKED_ROWS = 64  # beyond this the kernels repeat the same tiles


def _randn(
    gen: torch.Generator, *shape: int, dtype: torch.dtype, scale: float = 1.0
) -> torch.Tensor:
    return (
        torch.randn(*shape, generator=gen, device=gen.device, dtype=torch.float32)
        .mul_(scale)
        .to(dtype)
    )


def _gen(device: torch.device, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


class CaseBuilder:
    def __init__(
        self,
        model: Transformer,
        rows: tuple[int, ...],
        decode_attention: DecodeAttention,
        chunk_attention: DecodeAttention | None,
        fused_attention: FusedDecodeAttention | None = None,
        fused_pick: bool = False,
    ) -> None:
        self.model = model
        self.fused_pick = fused_pick
        self.cfg = model.cfg
        weight = model.tok_embeddings.weight
        self.device, self.dtype = weight.device, weight.dtype
        self.tol = TOLERANCE[self.dtype]
        self.rows = rows
        self.decode_attention = decode_attention
        self.chunk_attention = chunk_attention
        self.fused_attention = fused_attention
        self._seed = 0
        self._weight: tuple[int, torch.Tensor | None] = (0, None)

    def seed(self) -> int:
        self._seed += 1
        return self._seed

    def cases(self) -> list[Case]:
        return [*self.glue(), *self.linear(), *self.attention(), *self.sampling()]

    # -- the fused glue --------------------------------------------------------

    def glue(self) -> Iterator[Case]:
        model, cfg, ops, torch_ops = self.model, self.cfg, self.model.ops, TorchOps()
        hidden, eps, label = cfg.hidden_size, cfg.rms_norm_eps, f"{ops.name}"
        inter = cfg.intermediate_size
        norm_w = model.layers[0].attention_norm.weight.detach()
        several = max((r for r in self.rows if 1 < r <= 16), default=1)
        for t in sorted({1, several}):

            def norm_inputs(seed: int, t: int = t) -> Inputs:
                g = _gen(self.device, seed)
                return {
                    "x": _randn(g, 1, t, hidden, dtype=self.dtype),
                    "residual": _randn(g, 1, t, hidden, dtype=self.dtype),
                    "weight": norm_w,
                }

            def fused(o: TorchOps, i: Inputs) -> Outputs:
                out = o.add_rms_norm(i["x"], i["residual"], i["weight"], eps)
                return out, i["residual"]

            yield Case(
                "rms_norm",
                f"rows={t} hidden={hidden}",
                partial(norm_inputs, self.seed()),
                lambda i: ops.rms_norm(i["x"], i["weight"], eps),
                lambda i: ref.rms_norm_ref(i["x"], i["weight"], eps),
                self.tol,
                lambda: label,
            )
            yield Case(
                "add_rms_norm",
                f"rows={t} hidden={hidden}",
                partial(norm_inputs, self.seed()),
                partial(fused, ops),
                partial(fused, torch_ops),
                self.tol,
                lambda: label,
            )
            yield self._rope(t)

            def act_inputs(seed: int, t: int = t) -> Inputs:
                return {
                    "gate_up": _randn(_gen(self.device, seed), 1, t, 2 * inter, dtype=self.dtype)
                }

            yield Case(
                "silu_mul",
                f"rows={t} intermediate={inter}",
                partial(act_inputs, self.seed()),
                lambda i: ops.silu_mul(i["gate_up"]),
                lambda i: ref.silu_mul_ref(i["gate_up"]),
                self.tol,
                lambda: label,
            )

    def _rope(self, t: int) -> Case:
        cfg, ops, model = self.cfg, self.model.ops, self.model
        s, d = model.max_context, cfg.head_dim
        width = (cfg.num_heads + 2 * cfg.num_kv_heads) * d

        def inputs(seed: int) -> Inputs:
            g = _gen(self.device, seed)
            return {
                "qkv": _randn(g, 1, t, width, dtype=self.dtype),
                "positions": torch.randperm(s, generator=g, device=self.device)[:t],
                "cos": model.rope_cos,
                "sin": model.rope_sin,
                "cache": KVCache(s, cfg.num_kv_heads, d, self.dtype, self.device),
            }

        def run(o: TorchOps, i: Inputs) -> Outputs:
            cache, pos = i["cache"], i["positions"]
            q = o.rope_cache(
                i["qkv"], pos, i["cos"], i["sin"], cache, cfg.num_heads, cfg.num_kv_heads
            )
            return q, cache.k[:, :, pos], cache.v[:, :, pos]

        return Case(
            "rope_cache",
            f"rows={t} heads={cfg.num_heads}/{cfg.num_kv_heads} dim={d}",
            partial(inputs, self.seed()),
            partial(run, ops),
            partial(run, TorchOps()),
            self.tol,
            lambda: ops.name,
        )

    # -- linear layers -----------------------------------------------------------

    def linear(self) -> Iterator[Case]:
        seen: set[tuple[str, int, int]] = set()
        for name, module in linears(self.model):
            out_f, in_f = int(module.out_features), int(module.in_features)
            key = (type(module).__name__, out_f, in_f)
            if key in seen:
                continue
            seen.add(key)
            for lo, hi, _, _ in row_classes(module, self.rows):
                largest = max(
                    (r for r in self.rows if lo <= r <= hi and r <= LARGEST_CHECKED_ROWS),
                    default=lo,
                )
                for t in sorted({lo, largest}):
                    yield self._linear_case(name, module, t)

    def _linear_case(self, name: str, module: nn.Module, t: int) -> Case:
        out_f, in_f = int(module.out_features), int(module.in_features)
        shape = f"rows={t} out={out_f} in={in_f} ({'lm_head' if name == HEAD else name})"
        x_seed = self.seed()
        bias = module.bias.detach() if module.bias is not None else None
        path: Callable[[], str] = lambda: linear_kernel(module, t)[0]  # noqa: E731
        if isinstance(module, Int4Linear):
            if t == 1 and module.fused is not None:
                return self._fused_gemv_case(module, shape, x_seed, path)

            def int4_inputs() -> Inputs:
                x = _randn(_gen(self.device, x_seed), 1, t, in_f, dtype=self.dtype)
                return {"x": x}

            def int4_ref(i: Inputs) -> Outputs:
                w = self._dequantized(module)
                out = i["x"].float() @ w.t()
                return out if bias is None else out + bias.float()

            # The module's own forward: the batch-1 GEMV at one row, the general kernels
            # (kernels.py) at more.
            return Case(
                "int4_linear",
                shape,
                int4_inputs,
                lambda i: module(i["x"]),
                int4_ref,
                max(INT4_TOLERANCE, self.tol),
                path,
            )
        weight = module.weight.detach()
        if is_gemv(module) and t == 1 and getattr(module, "fused", None) is not None:
            return self._fused_gemv_case(module, shape, x_seed, path)

        def inputs() -> Inputs:
            x = _randn(_gen(self.device, x_seed), 1, t, in_f, dtype=self.dtype)
            return {"x": x, "weight": weight, "bias": bias}

        def reference(i: Inputs) -> Outputs:
            out = i["x"].float() @ i["weight"].float().t()
            return out if i["bias"] is None else out + i["bias"].float()

        def run(i: Inputs) -> Outputs:
            if is_gemv(module):
                from nib.engine.kernels.gemv import gemv_linear

                return gemv_linear(i["x"], i["weight"], i["bias"], module.config, module.buffers)  # type: ignore[arg-type]
            return F.linear(i["x"], i["weight"], i["bias"])

        return Case("linear", shape, inputs, run, reference, self.tol, path)

    def _fused_gemv_case(
        self, module: nn.Module, shape: str, x_seed: int, path: Callable[[], str]
    ) -> Case:
        """The batch-1 GEMV with its fused glue (kernels/gemv.py, quant/fused_gemv.py),
        against the unfused sequence in fp32: norm -> linear (-> SiLU·mul), or linear ->
        residual add."""
        int4 = isinstance(module, Int4Linear)
        fusion = module.fusion
        bias = module.bias.detach() if module.bias is not None else None
        out_f, in_f = int(module.out_features), int(module.in_features)
        eps = 1e-6

        def weight() -> torch.Tensor:
            return self._dequantized(module) if int4 else module.weight.detach().float()  # type: ignore[arg-type]

        def inputs() -> Inputs:
            g = _gen(self.device, x_seed)
            return {
                "x": _randn(g, 1, 1, in_f, dtype=self.dtype, scale=3.0),
                "norm_weight": _randn(g, in_f, dtype=self.dtype, scale=0.1) + 1,
                "residual": _randn(g, 1, 1, out_f, dtype=self.dtype),
            }

        def run(i: Inputs) -> Outputs:
            if fusion == "residual":
                r = i["residual"].clone()
                module.residual_forward(i["x"], r)  # type: ignore[operator]
                return r
            glu = fusion == "norm_glu"
            out: torch.Tensor = module.norm_forward(i["x"], i["norm_weight"], eps, glu)  # type: ignore[operator]
            return out

        def reference(i: Inputs) -> Outputs:
            x = i["x"].float()
            if fusion != "residual":
                x = (
                    x
                    * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
                    * i["norm_weight"].float()
                )
            out = x @ weight().t()
            out = out if bias is None else out + bias.float()
            if fusion == "residual":
                return i["residual"].float() + out
            if fusion == "norm_glu":
                gate, up = out.chunk(2, dim=-1)
                return F.silu(gate) * up
            return out

        # Named like the unfused cases (the path says "+norm" etc.), so one name covers
        # every path of a weight format, fused or not.
        if int4:
            tol = max(INT4_TOLERANCE, self.tol)
            return Case("int4_linear", shape, inputs, run, reference, tol, path)
        return Case("linear", shape, inputs, run, reference, self.tol, path)

    def _dequantized(self, module: Int4Linear) -> torch.Tensor:
        """The fp32 weight of the module whose cases run now (one at a time: a 7B lm_head
        takes 0.5 GB in fp32, and each of its row classes needs it)."""
        key = id(module)
        if self._weight[0] != key:
            self._weight = (key, None)  # drop the previous one first
            self._weight = (key, module.dequantized())
        w = self._weight[1]
        assert w is not None
        return w

    # -- attention -----------------------------------------------------------------

    def attention(self) -> Iterator[Case]:
        cfg, s = self.cfg, self.model.max_context
        h, kvh, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        heads = f"heads={h}/{kvh} dim={d}"

        def inputs(seed: int, t: int, first: int) -> Inputs:
            g = _gen(self.device, seed)
            return {
                "q": _randn(g, 1, h, t, d, dtype=self.dtype),
                "k": _randn(g, 1, kvh, s, d, dtype=self.dtype),
                "v": _randn(g, 1, kvh, s, d, dtype=self.dtype),
                "positions": torch.arange(first, first + t, device=self.device),
            }

        def reference(i: Inputs) -> Outputs:
            return ref.attention_ref(i["q"], i["k"], i["v"], i["positions"])

        def split_k(attention: DecodeAttention, i: Inputs) -> Outputs:
            return attention(i["q"], i["k"], i["v"], i["positions"])

        label = "triton split-K decode attention"
        for length in sorted({s // 2 + 3, s} - {0}):
            if length > s:
                continue
            yield Case(
                "decode_attention",
                f"queries=1 context={length} {heads}",
                partial(inputs, self.seed(), 1, length - 1),
                partial(split_k, self.decode_attention),
                reference,
                self.tol,
                lambda: label,
            )
        if self.fused_attention is not None:
            for length in sorted({1, s // 2 + 3, s}):
                yield self._fused_attention_case(self.fused_attention, length, heads)
        multi = self.chunk_attention
        if multi is not None and multi.max_queries > 1:
            t = min(multi.max_queries, s)
            yield Case(
                "decode_attention",
                f"queries={t} context={s} {heads}",
                partial(inputs, self.seed(), t, s - t),
                partial(split_k, multi),
                reference,
                self.tol,
                lambda: label + ", multi-query",
            )
        t = min(64, s)

        def prefill(i: Inputs) -> Outputs:
            cache = KVCache(s, kvh, d, self.dtype, self.device)
            cache.k.copy_(i["k"])
            cache.v.copy_(i["v"])
            return fresh_prefill_attention(i["q"], cache, i["positions"], None)

        yield Case(
            "prefill_attention",
            f"queries={t} {heads}",
            partial(inputs, self.seed(), t, 0),
            prefill,
            reference,
            self.tol,
            lambda: "torch sdpa (causal)",
        )

    def _fused_attention_case(self, fused: FusedDecodeAttention, length: int, heads: str) -> Case:
        """The decode graph's one launch (RoPE, the KV-cache write at p = length - 1,
        attention over [0, p]) against the float64 reference of the same op: the output
        and the cache rows written at p."""
        from nib.engine.cuda.attention import reference as fused_reference

        cfg, model, s = self.cfg, self.model, self.model.max_context
        h, kvh, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        seed = self.seed()

        def inputs() -> Inputs:
            g = _gen(self.device, seed)
            return {
                "qkv": _randn(g, 1, 1, (h + 2 * kvh) * d, dtype=self.dtype),
                "k": _randn(g, 1, kvh, s, d, dtype=self.dtype),
                "v": _randn(g, 1, kvh, s, d, dtype=self.dtype),
                "positions": torch.tensor([length - 1], device=self.device),
                "cos": model.rope_cos,
                "sin": model.rope_sin,
            }

        def written(i: Inputs, out: torch.Tensor) -> Outputs:
            p = length - 1
            return out, i["k"][:, :, p], i["v"][:, :, p]

        def run(i: Inputs) -> Outputs:
            out = fused(i["qkv"], i["positions"], i["cos"], i["sin"], i["k"], i["v"])
            return written(i, out)

        def reference(i: Inputs) -> Outputs:
            out = fused_reference(
                i["qkv"], i["positions"], i["cos"], i["sin"], i["k"], i["v"], h, kvh
            )
            return written(i, out)

        return Case(
            "decode_attention",
            f"queries=1 context={length} {heads} (rope + kv write fused)",
            inputs,
            run,
            reference,
            self.tol,
            fused.label,
        )

    # -- sampling ------------------------------------------------------------------

    def sampling(self) -> Iterator[Case]:
        from nib.engine.kernels.sampling import exp_noise

        def noise_inputs() -> Inputs:
            return {
                "out": torch.empty(NOISE_SAMPLES, device=self.device),
                "seed": torch.tensor([1234], device=self.device),
                "step": torch.tensor([5], device=self.device),
            }

        def draw(i: Inputs) -> Outputs:
            a = exp_noise(i["out"].clone(), i["seed"], i["step"])
            b = exp_noise(i["out"].clone(), i["seed"], i["step"])
            c = exp_noise(i["out"].clone(), i["seed"], i["step"] + 1)
            return a, b, c

        yield Case(
            "exp_noise",
            f"samples={NOISE_SAMPLES}",
            noise_inputs,
            draw,
            lambda i: (),
            0.03,
            lambda: "triton philox",
            compare=_check_noise,
        )
        vocab = self.cfg.vocab_size
        for temperature, top_k, top_p in ((0.8, 0, 1.0), (1.0, 40, 0.9)):

            def inputs(
                seed: int,
                temperature: float = temperature,
                top_k: int = top_k,
                top_p: float = top_p,
            ) -> Inputs:
                logits = _randn(_gen(self.device, seed), vocab, dtype=torch.float32, scale=3.0)
                return {"logits": logits, "params": (temperature, top_k, top_p, seed)}

            yield Case(
                "sampling",
                f"vocab={vocab} temperature={temperature} top_k={top_k} top_p={top_p}",
                partial(inputs, self.seed()),
                partial(_device_sample, vocab),
                lambda i: (i["logits"], torch.tensor(i["params"][:3], dtype=torch.float64)),
                1e-6,
                lambda: "torch top-k/top-p + triton philox race",
                compare=_check_sample,
            )
        yield from self._greedy()
        yield from self._fused_pick()
        yield from self._embedding()

    def _embedding(self) -> Iterator[Case]:
        """The decode graph's CUDA embedding lookup (graphs.py uses it where it runs): the
        model's own table at random tokens and both ends of the vocabulary, exactly."""
        table = self.model.tok_embeddings.weight.detach()
        embed = cuda_embedding(table)
        if embed is None:
            return
        vocab = table.shape[0]

        def inputs(seed: int) -> Inputs:
            g = _gen(self.device, seed)
            picks = torch.randint(0, vocab, (5,), generator=g, device=self.device)
            ends = torch.tensor([0, vocab - 1], device=self.device)
            return {"tokens": torch.cat((picks, ends)).view(1, -1)}

        def run(i: Inputs) -> Outputs:
            return embed(i["tokens"])

        def reference(i: Inputs) -> Outputs:
            return F.embedding(i["tokens"], table)

        def exact(out: Outputs, want: Outputs) -> tuple[float, str]:
            if not torch.equal(out, want):
                return math.inf, "a row differs from the table's (a copy must be exact)"
            return 0.0, ""

        yield Case(
            "embedding",
            f"rows=7 vocab={vocab} hidden={table.shape[1]}",
            partial(inputs, self.seed()),
            run,
            reference,
            0.0,
            lambda: str(embed.label),
            compare=exact,
        )

    def _greedy(self) -> Iterator[Case]:
        """The CUDA greedy kernel (graphs.py uses it where it is available): one row with
        and without a token-healing bias, and the verify graph's rows."""
        vocab = self.cfg.vocab_size
        several = max((r for r in self.rows if r <= 8), default=1)
        greedy = cuda_greedy(vocab, several, self.device)
        if greedy is None:
            return
        for rows, biased in sorted({(1, True), (1, False), (several, False)}):
            yield Case(
                "greedy",
                f"rows={rows} vocab={vocab} dtype={str(self.dtype).split('.')[-1]}"
                + (" +bias" if biased else ""),
                partial(_greedy_inputs, vocab, rows, biased, self.dtype, self.device, self.seed()),
                partial(_greedy_run, greedy),
                _greedy_ref,
                GREEDY_TOLERANCE,
                lambda greedy=greedy: str(greedy.label),
                compare=_check_greedy,
            )

    def _fused_pick(self) -> Iterator[Case]:
        """The greedy pick folded into the INT4 lm_head's epilogue (the greedy decode
        graphs use it where the lm_head is nib's CUDA kernel, graphs.PickingHead): the
        model's own lm_head and final norm weight on a random hidden state, against the
        same launch without the pick and torch.argmax / logsumexp over its logits."""
        if not self.fused_pick:  # the decode graphs keep the pick a kernel of its own
            return
        output = self.model.output
        packed = output.cuda if isinstance(output, Int4Linear) else None
        if packed is None or packed.fusion != "norm":
            return
        greedy = cuda_greedy(self.cfg.vocab_size, 1, self.device)
        probe = torch.empty(1, dtype=torch.int64).pin_memory()
        if greedy is None or greedy.address(probe) is None:
            return  # pinned slots unmapped: graphs.py keeps the pick a kernel of its own
        pick = FusedPick(greedy, packed.tiles)
        norm_weight, eps = self.model.norm.weight, self.cfg.rms_norm_eps
        seed = self.seed()

        def inputs() -> Inputs:
            return {"h": _randn(_gen(self.device, seed), packed.k, dtype=self.dtype, scale=2.0)}

        def run(i: Inputs) -> Outputs:
            token = torch.full((1,), -1, dtype=torch.int64).pin_memory()
            logprob = torch.full((1,), math.nan).pin_memory()
            pos = torch.full((1,), GREEDY_POSITION, dtype=torch.int64, device=self.device)
            pointers = pick.pointers(token, logprob, advance=pos)
            if pointers is None:
                raise RuntimeError("pinned memory is no longer mapped for the device")
            logits = packed.norm(i["h"], norm_weight, eps, pick=pointers)
            torch.cuda.synchronize()
            return token, logprob, pos.cpu(), logits.cpu()

        def reference(i: Inputs) -> Outputs:
            logits = packed.norm(i["h"], norm_weight, eps)
            return (*_greedy_ref({"logits": logits[None], "bias": None}), logits.cpu())

        def compare(out: Outputs, want: Outputs) -> tuple[float, str]:
            if not torch.equal(out[3], want[3]):
                return math.inf, "the logits differ from the same launch without the pick"
            return _check_greedy(out[:3], want[:3])

        yield Case(
            "greedy",
            f"fused into the lm_head out={packed.out_features} in={packed.k}",
            inputs,
            run,
            reference,
            GREEDY_TOLERANCE,
            lambda: PICK_FUSED,
            compare=compare,
        )


def _greedy_inputs(
    vocab: int, rows: int, biased: bool, dtype: torch.dtype, device: torch.device, seed: int
) -> Inputs:
    """Random logits with the maximum planted at three places a < b < c of every row: the
    first must win. With a bias (small, -inf on a tenth of the vocabulary and on row 0's
    a, 0 on its b and c), b must."""
    g = _gen(device, seed)
    logits = _randn(g, rows, vocab, dtype=dtype, scale=3.0)
    top = (logits.float().amax(dim=1) + 1).to(dtype)
    bias = _randn(g, vocab, dtype=torch.float32, scale=0.1) if biased else None
    if bias is not None:
        bias[torch.rand(vocab, generator=g, device=device) < 0.1] = -math.inf
    if vocab >= 3:
        for r in range(rows):
            a, b, c = torch.randperm(vocab, generator=g, device=device)[:3].sort().values
            logits[r, torch.stack((a, b, c))] = top[r]
            if bias is not None and r == 0:
                bias[torch.stack((b, c))] = 0.0
                bias[a] = -math.inf
    return {"logits": logits, "bias": bias}


GREEDY_POSITION = 41  # where the decode position stands before the pick advances it


def _greedy_run(greedy: CudaGreedy, i: Inputs) -> Outputs:
    """The kernel as the graphs run it: the outputs in pinned host memory, and a decode
    position for it to advance."""
    rows = i["logits"].shape[0]
    token = torch.full((rows,), -1, dtype=torch.int64).pin_memory()
    logprob = torch.full((rows,), math.nan).pin_memory()
    pos = torch.full((1,), GREEDY_POSITION, dtype=torch.int64, device=i["logits"].device)
    greedy.run(i["logits"], token, logprob, i["bias"], advance=pos)
    torch.cuda.synchronize()  # the self-check only waits for outputs on the device
    return token, logprob, pos.cpu()


def _greedy_ref(i: Inputs) -> Outputs:
    row = i["logits"].float()
    choose = row if i["bias"] is None else row + i["bias"]
    token = choose.argmax(dim=-1)
    logprob = row.gather(1, token[:, None])[:, 0] - row.logsumexp(dim=-1)
    return token.cpu(), logprob.cpu(), torch.tensor([GREEDY_POSITION + 1])


def _check_greedy(out: Outputs, reference: Outputs) -> tuple[float, str]:
    """Tokens equal to torch.argmax's (ties: the first index), the position advanced by
    exactly one; the largest log-probability difference as the error."""
    token, logprob, pos = out
    ref_token, ref_logprob, ref_pos = reference
    if not torch.equal(pos, ref_pos):
        return math.inf, f"the position went from {GREEDY_POSITION} to {int(pos[0])}, not + 1"
    if not torch.equal(token, ref_token):
        bad = int((token != ref_token).nonzero()[0, 0])
        return math.inf, (
            f"row {bad}: token {int(token[bad])}, torch.argmax says {int(ref_token[bad])}"
        )
    if not torch.isfinite(logprob).all():
        return math.inf, "a log-probability is not finite (unwritten?)"
    return float((logprob.double() - ref_logprob.double()).abs().max()), ""


def _device_sample(vocab: int, i: Inputs) -> Outputs:
    logits = i["logits"]
    temperature, top_k, top_p, seed = i["params"]
    sampler = DeviceSampler(vocab, logits.device)
    sampler.temperature.fill_(temperature)
    sampler.top_k.fill_(top_k)
    sampler.top_p.fill_(top_p)
    sampler.seed.fill_(seed)
    token = sampler.sample(logits)
    return token, sampler.noise.clone()


def _check_sample(out: Outputs, reference: Outputs) -> tuple[float, str]:
    """0 when the device sampler chose the token the reference race picks with the same
    noise; else how far below the best score its choice is (relative)."""
    token, noise = out
    logits, params = reference
    temperature, top_k, top_p = params.tolist()
    order, scores = ref.sample_scores_ref(logits, temperature, int(top_k), top_p, noise)
    best = float(scores.max())
    rank = int((order == token.view(-1)[0]).nonzero()[0, 0])
    chosen = float(scores[rank])
    if chosen < 0:
        return math.inf, f"sampled token {int(token)} (rank {rank}) is outside top-k/top-p"
    return (best - chosen) / best, ""


def _check_noise(out: Outputs, reference: Outputs) -> tuple[float, str]:
    """Exp(1) noise: the same (seed, step) gives the same draws, the next step others;
    mean 1 and median ln 2 within 0.03 (the standard errors are ~0.004 and ~0.002)."""
    a, b, c = out
    if not torch.equal(a, b):
        return math.inf, "the same seed and step gave different noise"
    if torch.equal(a, c):
        return math.inf, "the next step gave the same noise"
    finite = a[torch.isfinite(a)]
    if finite.numel() < a.numel() - 1 or not bool((finite > 0).all()):
        return math.inf, "noise is not positive and finite"
    mean_off = abs(float(finite.double().mean()) - 1.0)
    median_off = abs(float((finite < math.log(2)).double().mean()) - 0.5) * 2
    return max(mean_off, median_off), ""


def build_cases(
    model: Transformer,
    rows: tuple[int, ...],
    decode_attention: DecodeAttention,
    chunk_attention: DecodeAttention | None = None,
    fused_attention: FusedDecodeAttention | None = None,
    fused_pick: bool = False,
) -> list[Case]:
    """Every case for `model` (its ops, linears and attention objects as the engine runs
    them), fed the row counts the engine uses; `fused_pick`: the decode graphs fold the
    greedy pick into the INT4 lm_head (GraphRunner.fuse_pick), so that is checked too."""
    return CaseBuilder(
        model, rows, decode_attention, chunk_attention, fused_attention, fused_pick
    ).cases()
