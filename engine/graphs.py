"""CUDA graphs for the decode loop: static buffers, captured prefill and decode steps.

Everything a graph touches is allocated here, before capture: the prompt
buffer, the current token and position (device tensors, so consecutive decode
replays need no host input), the sampler's state, and pinned host slots that
each step writes its token into. Graphs:

- prefill-<B>-{greedy,sample}: a prompt padded to bucket B, from position 0;
  samples the first token into slot 2.
- chunk-<T>-{greedy,sample}: T new tokens after a reused prefix of device
  length p0 (prefix reuse); attention is the split-K decode kernel with one
  query per token, so only the filled cache is read.
- verify-<T>: the current token and T-1 drafted ones (speculative decoding);
  writes every position's argmax and its log-probability.
- decode-{greedy,sample}-{0,1}: one token; two parities write alternate pinned
  slots, so the host can read step n while step n+1 already runs. RoPE, the
  KV-cache write and attention are one CUDA kernel there (cuda/attention.py)
  where it runs, else the Triton rope_cache + split-K pair; the embedding
  lookup (cuda/embed.py) and the greedy pick, which also advances the position
  (cuda/greedy.py), are CUDA kernels that let their neighbours overlap them; where
  the lm_head runs nib's CUDA INT4 kernel, the greedy decode graphs can fold the pick
  into its epilogue instead (PickingHead, GraphRunner.fuse_pick): one kernel fewer a
  step, off by default (on the H200 it measured slower).

A body that fails to capture runs eagerly instead (same code, no graph): the
shape stays served, `fallbacks` counts it and the state says why.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial

import torch

from nib.engine.cuda.attention import for_model as fused_for_model
from nib.engine.cuda.embed import cuda_embedding
from nib.engine.cuda.greedy import FusedPick, cuda_greedy
from nib.engine.device_sampling import DeviceSampler
from nib.engine.graphs_common import decode_attend_fn
from nib.engine.kernels.decode_attention import DecodeAttention
from nib.engine.model import Transformer
from nib.engine.ops import fresh_prefill_attention
from nib.engine.quant.linear import Int4Linear
from nib.engine.request import GenerationParams
from nib.engine.speculative import MAX_DRAFT, Speculator, interleave

log = logging.getLogger("nib.engine")

PREFILL_SLOT = 2


CHUNK_BUCKETS = (4, 8, 16, 32, 64, 128)
VERIFY_BUCKETS = (4, MAX_DRAFT + 1)  # 1 current token + up to MAX_DRAFT drafted ones


def bucket_ladder(max_context: int, smallest: int = 16) -> tuple[int, ...]:
    """Powers of two from `smallest` up to max_context (which is always the last bucket)."""
    buckets, b = [], smallest
    while b < max_context:
        buckets.append(b)
        b *= 2
    return (*buckets, max_context)


class PickingHead:
    """Transformer.forward's `head` in a greedy decode step: the final norm, the lm_head
    and the greedy pick in one launch (w4a16.cu's epilogue with pick.cuh), where the
    lm_head is nib's CUDA INT4 kernel with the norm fused and nothing is left to add to
    the residual; elsewhere None (the usual head; the step then runs the greedy kernel).
    The pick writes what GraphRunner._finish's kernel would: the token into the pinned
    slot and the device token, its log-probability, and the position + 1."""

    def __init__(self, runner: GraphRunner, slot: int) -> None:
        self.runner, self.slot = runner, slot
        self.picked = False

    def __call__(
        self,
        residual: torch.Tensor,
        pending: torch.Tensor | None,
        weight: torch.Tensor,
        eps: float,
        linear: torch.nn.Module,
    ) -> torch.Tensor | None:
        # The runner made this head only where pick_fusable() holds (the lm_head is the
        # CUDA INT4 kernel with the norm fused): what is left is the step's own state.
        assert isinstance(linear, Int4Linear) and linear.cuda is not None
        packed = linear.cuda
        if pending is not None or linear.use_reference or residual.numel() != packed.k:
            return None
        r = self.runner
        assert r.greedy is not None
        if r.fused_pick is None or r.fused_pick.parts < packed.tiles:
            r.fused_pick = FusedPick(r.greedy, packed.tiles)
        pointers = r.fused_pick.pointers(
            r.out_token[self.slot : self.slot + 1],
            r.out_logprob[self.slot : self.slot + 1],
            r.token.view(1),
            r.pos,
        )
        if pointers is None:  # pinned slots not mapped: the greedy kernel copies instead
            return None
        self.picked = True
        logits: torch.Tensor = linear.norm_forward(residual, weight, eps, False, pick=pointers)
        return logits


@dataclass
class GraphState:
    name: str
    ready: bool = False
    fallback: bool = False
    capture_ms: float = 0.0
    error: str = ""


class GraphRunner:
    def __init__(
        self,
        model: Transformer,
        max_context: int,
        *,
        buckets: tuple[int, ...] | None = None,
        use_graphs: bool = True,
        keep_logits: bool = False,
        on_fallback: Callable[[str], None] | None = None,
    ) -> None:
        cfg = model.cfg
        device = model.tok_embeddings.weight.device
        self.model = model
        self.device = device
        self.max_context = max_context
        # What start-up's step tuning measured and chose (engine/step_tuning.py), if it ran.
        self.step_tuning: dict[str, object] | None = None
        # Start-up's timing of a verify step in decode steps, and each step in µs
        # (measure_step_costs); empty until measured.
        self.verify_costs: dict[int, float] = {}
        self.step_us: dict[int, float] = {}
        self.use_graphs = use_graphs
        self.buckets = buckets or bucket_ladder(max_context)
        biggest = self.buckets[-1]
        self.tokens_in = torch.zeros((1, biggest), dtype=torch.long, device=device)
        self.positions = torch.arange(biggest, device=device)
        # [n_prompt, index of the last prompt token in the step's input, reused prefix p0]
        self.meta = torch.zeros(3, dtype=torch.long, device=device)
        self.token = torch.zeros((1, 1), dtype=torch.long, device=device)
        self.pos = torch.zeros(1, dtype=torch.long, device=device)
        self.sampler = DeviceSampler(cfg.vocab_size, device)
        self.attention = DecodeAttention(
            cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, max_context, device
        )
        # One token: RoPE, the KV-cache write and attention in one CUDA launch where the
        # kernel runs here; else (and for every multi-token graph) the Triton pair.
        self.fused_attention, self.fused_attention_why = fused_for_model(
            cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, model.max_context or max_context,
            model.tok_embeddings.weight.dtype, device,
        )  # fmt: skip
        if self.fused_attention is None:
            log.info("decode attention: triton rope_cache + split-K (%s)", self.fused_attention_why)
        self._decode_attend = decode_attend_fn(self.attention, self.fused_attention)
        self.chunk_buckets = tuple(b for b in CHUNK_BUCKETS if b < max_context)
        self.chunk_attention = DecodeAttention(
            cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, max_context, device,
            max_queries=max(self.chunk_buckets, default=1),
        )  # fmt: skip
        self._chunk_attend = decode_attend_fn(self.chunk_attention)
        self.out_token = torch.zeros(3, dtype=torch.long).pin_memory()
        self.out_logprob = torch.zeros(3, dtype=torch.float32).pin_memory()
        self.verify_buckets = tuple(b for b in VERIFY_BUCKETS if b < max_context)
        rows = max(self.verify_buckets, default=1)
        self.out_rows = torch.zeros(rows, dtype=torch.long).pin_memory()
        self.out_row_logprobs = torch.zeros(rows, dtype=torch.float32).pin_memory()
        # Greedy argmax + log-probability in one kernel that stores into the pinned slots
        # itself (engine/cuda/greedy.py); None: the PyTorch sequence below.
        self.greedy = cuda_greedy(cfg.vocab_size, rows, device)
        # The decode step's embedding lookup in a kernel that lets the first GEMV launch
        # early (engine/cuda/embed.py); None: PyTorch's embedding.
        self.embed = cuda_embedding(model.tok_embeddings.weight)
        # The greedy kernel advances the decode position itself (False: a PyTorch add
        # before it, as before; bench/step_ends.py times the two against each other).
        self.greedy_advances = True
        # The greedy decode graphs' pick in the lm_head's epilogue where it can be
        # (PickingHead), else the lm_head, then the greedy kernel. Off: on the H200 it
        # measured slower (bench/fused_pick.py). tune_pick lets start-up's step tuning
        # time both and keep the faster (engine/step_tuning.py).
        self.fuse_pick = False
        self.tune_pick = False
        self.fused_pick: FusedPick | None = None  # its workspace, made on first use
        self.pick_fused = False  # whether the last greedy decode body ran the pick fused
        self._state_staging = torch.zeros(2, dtype=torch.long).pin_memory()
        self._staging = torch.zeros(biggest + 3, dtype=torch.long).pin_memory()
        self.keep_logits = keep_logits  # tests: every step also copies its logits here
        # Added to the prefill's logits before the first token is chosen (token healing).
        self.first_bias = torch.zeros(cfg.vocab_size, device=device)
        self._first_bias_clear = True
        self.on_fallback = on_fallback  # told each time a shape runs eagerly for want of a graph
        self.last_logits = torch.zeros(cfg.vocab_size, device=device)
        self.stream = torch.cuda.Stream(device)
        self.events = [torch.cuda.Event() for _ in range(3)]
        self.graphs: dict[str, torch.cuda.CUDAGraph] = {}
        self.states: dict[str, GraphState] = {}
        self.fallbacks: dict[str, int] = {}
        self.pool: tuple[int, int] | None = None  # the graphs' private memory pool, once captured
        self.bodies: dict[str, Callable[[], None]] = {}
        for b in self.buckets:
            for greedy in (True, False):
                self.bodies[self._prefill_name(b, greedy)] = partial(self._prefill_body, b, greedy)
        for b in self.chunk_buckets:
            for greedy in (True, False):
                self.bodies[self._chunk_name(b, greedy)] = partial(self._chunk_body, b, greedy)
        for b in self.verify_buckets:
            self.bodies[f"verify-{b}"] = partial(self._verify_body, b)
        for greedy in (True, False):
            for parity in (0, 1):
                self.bodies[self._decode_name(parity, greedy)] = partial(
                    self._decode_body, parity, greedy
                )
        for name in self.bodies:
            self.states[name] = GraphState(name)

    # -- step bodies: graph-safe, and run as they are when a graph is missing --

    @staticmethod
    def _prefill_name(bucket: int, greedy: bool) -> str:
        return f"prefill-{bucket}-{'greedy' if greedy else 'sample'}"

    @staticmethod
    def _chunk_name(bucket: int, greedy: bool) -> str:
        return f"chunk-{bucket}-{'greedy' if greedy else 'sample'}"

    @staticmethod
    def _decode_name(parity: int, greedy: bool) -> str:
        return f"decode-{'greedy' if greedy else 'sample'}-{parity}"

    def _finish(
        self,
        logits: torch.Tensor,
        greedy: bool,
        slot: int,
        bias: torch.Tensor | None = None,
        advance: bool = False,
    ) -> None:
        """The step's token from its logits, into the pinned slot and self.token; with
        `advance`, the position moves on by one (a decode step): in the greedy kernel
        where it runs and `greedy_advances`, else by a PyTorch add before the pick."""
        fused = greedy and self.greedy is not None
        in_kernel = advance and fused and self.greedy_advances
        if advance and not in_kernel:
            self.pos.add_(1)
        if fused:
            assert self.greedy is not None
            if self.keep_logits:
                self.last_logits.copy_(logits[0, 0].float())
            # Token and log-probability land in the pinned slots (or, unmapped, are copied
            # there) before the event the caller records after this body; see greedy.cu.
            self.greedy.run(
                logits[0, :1],
                self.out_token[slot : slot + 1],
                self.out_logprob[slot : slot + 1],
                bias,
                self.token.view(1),
                self.pos if in_kernel else None,  # no kernel of its own before this one
            )
            return
        row = logits[0, 0].float()
        if self.keep_logits:
            self.last_logits.copy_(row)
        choose = row if bias is None else row + bias  # token healing restricts the first token
        token = DeviceSampler.greedy(choose) if greedy else self.sampler.sample(choose)
        logprob = row.gather(0, token) - row.logsumexp(dim=0, keepdim=True)
        self.token.copy_(token.view(1, 1))
        self.out_token[slot : slot + 1].copy_(token, non_blocking=True)
        self.out_logprob[slot : slot + 1].copy_(logprob, non_blocking=True)

    def _prefill_body(self, bucket: int, greedy: bool) -> None:
        logits = self.model(
            self.tokens_in[:, :bucket],
            self.positions[:bucket],
            gather_index=self.meta[1:2],
            attend=fresh_prefill_attention,
        )
        self.pos.copy_(self.meta[0:1])
        self._finish(logits, greedy, PREFILL_SLOT, self.first_bias)

    def _chunk_body(self, bucket: int, greedy: bool) -> None:
        logits = self.model(
            self.tokens_in[:, :bucket],
            self.positions[:bucket] + self.meta[2:3],
            gather_index=self.meta[1:2],
            attend=self._chunk_attend,
        )
        self.pos.copy_(self.meta[0:1])
        self._finish(logits, greedy, PREFILL_SLOT, self.first_bias)

    def _verify_body(self, bucket: int) -> None:
        logits = self.model(
            self.tokens_in[:, :bucket],
            self.positions[:bucket] + self.meta[2:3],
            attend=self._chunk_attend,
        )[0]
        if self.greedy is not None:
            self.greedy.run(logits, self.out_rows[:bucket], self.out_row_logprobs[:bucket])
            return
        logits = logits.float()
        best = logits.argmax(dim=-1)
        logprob = logits.gather(1, best[:, None])[:, 0] - logits.logsumexp(dim=-1)
        self.out_rows[:bucket].copy_(best, non_blocking=True)
        self.out_row_logprobs[:bucket].copy_(logprob, non_blocking=True)

    def _decode_body(self, parity: int, greedy: bool) -> None:
        head = PickingHead(self, parity) if greedy and self._can_fuse_pick() else None
        logits = self.model(
            self.token, self.pos, attend=self._decode_attend, embed=self.embed, head=head
        )
        if greedy:
            self.pick_fused = head is not None and head.picked
        if head is not None and head.picked:
            if self.keep_logits:
                self.last_logits.copy_(logits[0, 0].float())
            return
        self._finish(logits, greedy, parity, advance=True)

    def _can_fuse_pick(self) -> bool:
        """Asked for, and the greedy kernel runs here and advances the position (what the
        fused pick does in its place)."""
        return self.fuse_pick and self.pick_fusable()

    def pick_fusable(self) -> bool:
        """Whether the greedy decode step can fold its pick into the lm_head here: the
        greedy kernel runs and advances the position, and the lm_head is nib's CUDA INT4
        kernel with the final norm fused (PickingHead's other conditions hold on the GPU
        path)."""
        out = self.model.output
        return (
            self.greedy is not None
            and self.greedy_advances
            and isinstance(out, Int4Linear)
            and out.cuda is not None
            and out.cuda.fusion == "norm"
        )

    # -- capture --------------------------------------------------------------

    def capture(self) -> None:
        """Warm every body up (compiles kernels), then capture each into a graph."""
        self._load_dummy_prompt()
        with torch.cuda.stream(self.stream), torch.inference_mode():
            for body in self.bodies.values():
                body()
                body()
        self.stream.synchronize()
        if not self.use_graphs:
            return
        pool = None
        for name, body in self.bodies.items():
            state = self.states[name]
            started = time.perf_counter()
            try:
                graph = torch.cuda.CUDAGraph()
                with torch.inference_mode(), torch.cuda.graph(graph, pool=pool, stream=self.stream):
                    body()
                pool = graph.pool() if pool is None else pool
                self.pool = pool
                self._load_dummy_prompt()
                with torch.cuda.stream(self.stream):
                    graph.replay()
                self.stream.synchronize()
                self.graphs[name] = graph
                state.ready = True
            except Exception as exc:  # keep serving this shape eagerly
                state.fallback, state.error = True, f"{type(exc).__name__}: {exc}"
                log.warning("graph %s failed to capture; running it eagerly: %s", name, state.error)
                torch.cuda.synchronize()
            state.capture_ms = (time.perf_counter() - started) * 1e3

    def measure_step_costs(self, reps: int = 10) -> dict[int, float]:
        """Time each verify step against a greedy decode step, launched as a request
        launches them (a verify with its input copies), back to back on our stream
        (CUDA events, median of three rounds), and keep the ratios as `verify_costs`
        {tokens: decode steps}, what Speculator.costs reads. Empty without graphs:
        verify steps then count as one decode step each."""
        names = [self._decode_name(p, True) for p in (0, 1)]
        names += [f"verify-{b}" for b in self.verify_buckets]
        if not all(name in self.graphs for name in names):
            return {}
        steps: dict[int, Callable[[int], object]] = {1: lambda i: self.decode(i % 2, True)}
        for b in self.verify_buckets:
            steps[b] = partial(lambda b, i: self.launch_verify(list(range(1, b + 1)), 8), b)
        us: dict[int, float] = {}
        for tokens, step in steps.items():
            rounds = []
            for _ in range(3):
                self._load_dummy_prompt()
                start, end = (
                    torch.cuda.Event(enable_timing=True),
                    torch.cuda.Event(enable_timing=True),
                )
                step(0)  # warm
                start.record(self.stream)
                for i in range(reps):
                    step(i)
                end.record(self.stream)
                end.synchronize()
                rounds.append(start.elapsed_time(end) * 1e3 / reps)
            us[tokens] = sorted(rounds)[1]
        self.step_us = us
        self.verify_costs = {b: us[b] / us[1] for b in self.verify_buckets}
        return self.verify_costs

    def _load_dummy_prompt(self) -> None:
        self.meta.copy_(torch.tensor([12, 3, 8]))
        self.pos.fill_(8)
        self.sampler.set_request_defaults()

    # -- running --------------------------------------------------------------

    def _run(self, name: str) -> None:
        graph = self.graphs.get(name)
        if graph is not None:
            graph.replay()
            return
        if self.use_graphs:
            self.fallbacks[name] = self.fallbacks.get(name, 0) + 1
            if self.on_fallback is not None:
                self.on_fallback(name)
        with torch.inference_mode():
            self.bodies[name]()

    def set_sampling(self, params: GenerationParams, seed: int) -> None:
        """Load a request's sampling parameters, ordered before its prefill on our stream."""
        with torch.cuda.stream(self.stream):
            self.sampler.set_request(params, seed)

    def set_first_bias(self, bias: torch.Tensor | None) -> None:
        """Restrict the next prefill's token (None: no restriction), on our stream."""
        if bias is None and self._first_bias_clear:
            return
        with torch.cuda.stream(self.stream):
            if bias is None:
                self.first_bias.zero_()
            else:
                self.first_bias.copy_(bias, non_blocking=True)
        self._first_bias_clear = bias is None

    def bucket_for(self, n: int) -> int:
        return next(b for b in self.buckets if b >= n)

    def chunk_for(self, start: int, n: int) -> int | None:
        """The chunk bucket for prompt tokens [start, n), or None for a full prefill."""
        new = n - start
        for b in self.chunk_buckets:
            if b >= new:
                return b if start + b <= self.positions.numel() else None
        return None

    def prefill(self, prompt_ids: list[int], greedy: bool, start: int = 0) -> torch.cuda.Event:
        """Prefill prompt_ids; the cache already holds valid keys/values for [0, start)."""
        n = len(prompt_ids)
        chunk = self.chunk_for(start, n) if start > 0 else None
        if chunk is None:
            start = 0
        new = prompt_ids[start:]
        staging = self._staging
        staging[0], staging[1], staging[2] = n, len(new) - 1, start
        staging[3 : 3 + len(new)] = torch.tensor(new, dtype=torch.long)
        with torch.cuda.stream(self.stream):
            self.meta.copy_(staging[:3], non_blocking=True)
            self.tokens_in[0, : len(new)].copy_(staging[3 : 3 + len(new)], non_blocking=True)
            if chunk is None:
                self._run(self._prefill_name(self.bucket_for(n), greedy))
            else:
                self._run(self._chunk_name(chunk, greedy))
            event = self.events[PREFILL_SLOT]
            event.record(self.stream)
        return event

    def decode(self, parity: int, greedy: bool) -> torch.cuda.Event:
        with torch.cuda.stream(self.stream):
            self._run(self._decode_name(parity, greedy))
            event = self.events[parity]
            event.record(self.stream)
        return event

    def generate(
        self, prompt_ids: list[int], greedy: bool, budget: int, start: int = 0
    ) -> Iterator[tuple[int, float]]:
        """Yield (token, logprob) for up to budget tokens. Step n+1 is launched before
        token n is yielded (it is already on the device), so whatever the caller does
        with token n overlaps the GPU's work; breaking out wastes at most that one step."""
        first = (self.prefill(prompt_ids, greedy, start), PREFILL_SLOT)
        yield from self._pipeline([first], budget - 1, greedy)

    def _pipeline(
        self, pending_init: list[tuple[torch.cuda.Event, int]], steps: int, greedy: bool
    ) -> Iterator[tuple[int, float]]:
        """Decode `steps` tokens from the device state, one step in flight ahead."""
        pending = collections.deque(pending_init)
        launched, parity = 0, 0
        while True:
            while launched < steps and len(pending) < 2:
                pending.append((self.decode(parity, greedy), parity))
                launched, parity = launched + 1, parity ^ 1
            if not pending:
                return
            event, slot = pending.popleft()
            event.synchronize()  # waits with the GIL released
            yield self.read(slot)

    def generate_speculative(
        self, prompt_ids: list[int], budget: int, start: int, spec: Speculator
    ) -> Iterator[tuple[int, float]]:
        """Greedy decoding with prompt-lookup drafts verified in one graph replay; the
        same tokens as generate(), with the next step launched before the host hands
        over a token here too (speculative.interleave)."""
        first = (self.prefill(prompt_ids, True, start), PREFILL_SLOT)
        max_draft = max(self.verify_buckets, default=1) - 1
        yield from interleave(_Steps(self), first, prompt_ids, budget, spec, max_draft)

    def launch_verify(self, tokens: list[int], pos: int) -> torch.cuda.Event:
        """Score [current token, drafts...] from pos in one verify graph; wait on the
        event, then read_verify."""
        bucket = next(b for b in self.verify_buckets if b >= len(tokens))
        staging = self._staging
        staging[0], staging[1], staging[2] = pos + len(tokens), len(tokens) - 1, pos
        staging[3 : 3 + len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        with torch.cuda.stream(self.stream):
            self.meta.copy_(staging[:3], non_blocking=True)
            self.tokens_in[0, : len(tokens)].copy_(staging[3 : 3 + len(tokens)], non_blocking=True)
            self._run(f"verify-{bucket}")
            event = self.events[PREFILL_SLOT]
            event.record(self.stream)
        return event

    def read_verify(self, n: int) -> tuple[list[int], list[float]]:
        """Each of the last verify step's first n positions: its argmax and log-probability."""
        return self.out_rows[:n].tolist(), self.out_row_logprobs[:n].tolist()

    def set_state(self, token: int, pos: int) -> None:
        """The next decode step's input token and its position."""
        self._state_staging[0], self._state_staging[1] = token, pos
        with torch.cuda.stream(self.stream):
            self.token.view(1).copy_(self._state_staging[0:1], non_blocking=True)
            self.pos.copy_(self._state_staging[1:2], non_blocking=True)

    def read(self, slot: int) -> tuple[int, float]:
        """The token and its log-probability from a slot whose event has completed."""
        return int(self.out_token[slot]), float(self.out_logprob[slot])


class _Steps:
    """A GraphRunner's greedy steps as speculative.interleave drives them: a step is
    the event to wait on and the pinned slot its token lands in."""

    def __init__(self, runner: GraphRunner) -> None:
        self.runner, self.parity = runner, 0

    def launch_decode(self) -> tuple[torch.cuda.Event, int]:
        parity, self.parity = self.parity, self.parity ^ 1
        return self.runner.decode(parity, True), parity

    def finish_decode(self, step: object) -> tuple[int, float]:
        event, slot = step  # type: ignore[misc]
        event.synchronize()  # waits with the GIL released
        return self.runner.read(slot)

    def launch_verify(self, tokens: list[int], pos: int) -> object:
        return self.runner.launch_verify(tokens, pos)

    def finish_verify(self, step: object, n: int) -> tuple[list[int], list[float]]:
        step.synchronize()  # type: ignore[attr-defined]
        return self.runner.read_verify(n)

    def set_state(self, token: int, pos: int) -> None:
        self.runner.set_state(token, pos)
