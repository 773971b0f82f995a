"""The engine: one thread owns the model and serves one request at a time.

Requests come in through submit(); each gets a Handle to cancel it. The thread
prefills the prompt, then decodes token after token, handing every event to
the request's sink (a callable the asyncio side wraps with
call_soon_threadsafe). Cancellation is checked between two decode steps.

Every submitted request gets exactly one DoneEvent, whatever happens: if the
thread dies, the request it was running and every queued one end with
FinishReason.ERROR and an EngineUnavailable cause, and later submits raise
EngineUnavailable.
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from nib.engine.config import ModelConfig
from nib.engine.errors import EngineUnavailable, InvalidRequest, QueueFull
from nib.engine.handle import Handle
from nib.engine.healing import HealedText, HealPlan, TokenHealer
from nib.engine.hooks import EngineHooks, EngineState
from nib.engine.kernel_paths import KernelPath, reference_paths
from nib.engine.loader import load_model
from nib.engine.memory import PoolUsage
from nib.engine.model import Transformer
from nib.engine.prefix_cache import PrefixCache
from nib.engine.quant.gptq_format import read_gptq_config
from nib.engine.quant.swap import describe
from nib.engine.request import (
    DoneEvent,
    Event,
    FinishReason,
    GenerationParams,
    Prompt,
    Timings,
    TokenEvent,
    Usage,
    unix_ms,
)
from nib.engine.sampling import Sampler
from nib.engine.selfcheck import SelfCheckReport, SelfCheckStatus
from nib.engine.speculative import Speculator, accept_greedy, accept_sampled
from nib.engine.startup import startup_record
from nib.engine.stats import EngineStats
from nib.engine.tokenizer import IncrementalDetokenizer, SessionTokens, StopMatcher, Tokenizer
from nib.engine.versions import Versions, collect_versions

if TYPE_CHECKING:
    from nib.engine.graphs import GraphRunner

log = logging.getLogger("nib.engine")

Sink = Callable[[Event], None]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class EngineConfig:
    model_dir: Path
    device: str = "cpu"
    dtype: str = "auto"  # auto: float32 on the CPU, bfloat16 on a GPU
    max_context: int = 2048
    max_tokens_limit: int = 1024
    default_max_tokens: int = 64
    max_queue: int = 64
    use_graphs: bool = True  # CUDA graphs on a GPU (off: the same kernels, launched eagerly)
    prefix_cache_entries: int = 4  # sequences whose KV is kept for reuse (0: no reuse)
    prefix_cache_bytes: int = 2 << 30  # budget for stashed copies of those sequences
    tune_kernels: bool = True  # time GEMV tile shapes per layer shape at start-up (GPU)
    quant: str = "auto"  # auto (as the checkpoint is) | none | int4 (see loader.load_model)
    # Prompt-lookup draft tokens per verify step (0: off). None: 6 on the CPU, 0 on a GPU,
    # where a verify step costs 1.3-3.6 decode steps and drafting lost in every H200 run
    # (README, "Prompt-lookup speculative decoding").
    speculative_k: int | None = None
    token_healing: bool = True  # re-choose the prompt's last token (see healing.py)
    # On a GPU below the kernels' compute capability, run the PyTorch reference path
    # instead of refusing to start (see engine/versions.py).
    allow_reference_fallback: bool = False

    @property
    def int4(self) -> bool:
        return self.quant == "int4" or (
            self.quant == "auto" and read_gptq_config(self.model_dir) is not None
        )

    @property
    def torch_dtype(self) -> torch.dtype:
        if self.dtype == "auto":
            if self.device == "cpu":
                return torch.float32
            return torch.float16 if self.int4 else torch.bfloat16  # INT4 kernels take fp16
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype {self.dtype!r} is not one of {sorted(_DTYPES)}")
        return _DTYPES[self.dtype]


@dataclass(frozen=True)
class ModelInfo:
    model: str
    architecture: str
    context_length: int
    vocab_size: int
    device: str
    dtype: str
    quantization: str
    max_tokens_limit: int
    supports_infill: bool
    graphs: tuple[tuple[str, bool, bool], ...] = ()  # (name, ready, fallback)
    versions: Versions | None = None
    kernel_paths: tuple[KernelPath, ...] = ()  # which kernel runs each layer
    speculative_k: int = 0  # draft tokens per verify step (0: off)
    verify_costs: tuple[tuple[int, float], ...] = ()  # (tokens, decode steps), GPU only


@dataclass
class _Job:
    request_id: str
    prompt_ids: list[int]
    params: GenerationParams
    sink: Sink
    handle: Handle
    session: str = ""
    arrival: float = field(default_factory=time.perf_counter)
    finished: bool = False  # its DoneEvent was sent


class Engine:
    def __init__(self, config: EngineConfig, hooks: EngineHooks | None = None) -> None:
        self.config = config
        self.hooks = hooks or EngineHooks()
        self.stats = EngineStats()
        self.model_config = ModelConfig.from_dir(config.model_dir)
        self.tokenizer = Tokenizer(config.model_dir, self.model_config.eos_token_ids)
        # Prompts of an editing session share most of their text: only what changed since
        # the session's last prompt is tokenised again (time to first token).
        self.session_tokens = SessionTokens(self.tokenizer)
        self.max_context = min(config.max_context, self.model_config.max_position_embeddings)
        if self.model_config.sliding_window:
            self.max_context = min(self.max_context, self.model_config.sliding_window)
        self.device = torch.device(config.device)
        self.speculative_k = (
            config.speculative_k
            if config.speculative_k is not None
            else (6 if self.device.type == "cpu" else 0)
        )
        self.dtype = config.torch_dtype
        self.healer = (
            TokenHealer(self.tokenizer, self.model_config.vocab_size, self.tokenizer.special_ids())
            if config.token_healing
            else None
        )
        self.model: Transformer | None = None
        self.runner: GraphRunner | None = None
        self.gemv_choices: dict[tuple[int, int], str] = {}
        # What the operator sees (health detail, model-info); filled in as the engine starts.
        cpu = self.device.type == "cpu"
        self.kernel_mode = "cpu" if cpu else "pending"  # then "triton" or "reference"
        self.versions = collect_versions(torch.device("cpu"))  # the GPU's, once started
        self.selfcheck = SelfCheckReport(
            SelfCheckStatus.NOT_RUN if cpu else SelfCheckStatus.PENDING,
            "the CPU engine runs the PyTorch references" if cpu else "runs before ready",
        )
        self.kernel_paths: tuple[KernelPath, ...] = ()
        self.graph_pool: PoolUsage | None = None
        self.prefix: PrefixCache | None = None
        self.prompt_tokens_reused = 0  # counters for metrics
        self.prompt_tokens_computed = 0
        self.speculation_stats = {"verifies": 0, "drafted": 0, "accepted": 0}
        self.ready = threading.Event()
        self._settled = threading.Event()  # ready, or failed: wait_ready stops waiting
        self.failure: BaseException | None = None
        # Unbounded: the limit is on live waiting requests (`_waiting`), so that
        # withdrawn requests still sitting in the queue take no one's place.
        self._queue: queue.Queue[_Job | None] = queue.Queue()
        self._waiting = 0
        self._waiting_lock = threading.Lock()
        self._current: _Job | None = None
        self._thread = threading.Thread(target=self._run, name="nib-engine", daemon=True)
        self._stopping = False
        self._finished = False  # the thread has stopped taking requests

    # -- lifecycle ---------------------------------------------------------

    def start(self) -> Engine:
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping = True
        self._queue.put(None)
        if self._thread.is_alive():
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def wait_ready(self, timeout: float | None = None) -> bool:
        """True once the engine serves; False at the timeout or as soon as it has failed
        to start (then `failure` says why)."""
        self._settled.wait(timeout)
        return self.ready.is_set()

    @property
    def step_choices(self) -> dict[str, str]:
        """What start-up's decode-step tuning chose per layer shape (engine/step_tuning.py);
        empty where it did not run."""
        tuning = self.runner.step_tuning if self.runner is not None else None
        return dict(tuning["chosen"]) if tuning else {}  # type: ignore[call-overload]

    @property
    def queue_depth(self) -> int:
        """Requests waiting to start (withdrawn ones excluded)."""
        return self._waiting

    def _left_queue(self) -> None:
        with self._waiting_lock:
            self._waiting -= 1

    def info(self) -> ModelInfo:
        cfg = self.model_config
        return ModelInfo(
            model=self.config.model_dir.name,
            architecture=cfg.model_type,
            context_length=self.max_context,
            vocab_size=cfg.vocab_size,
            device=str(self.device),
            dtype=str(self.dtype).removeprefix("torch."),
            quantization="none" if self.model is None else describe(self.model),
            max_tokens_limit=self.config.max_tokens_limit,
            supports_infill=self.tokenizer.fim is not None,
            graphs=tuple(
                (s.name, s.ready, s.fallback)
                for s in (self.runner.states.values() if self.runner else ())
            ),
            versions=self.versions,
            kernel_paths=self.kernel_paths,
            speculative_k=self.speculative_k,
            verify_costs=tuple(sorted(self.runner.verify_costs.items())) if self.runner else (),
        )

    # -- requests ----------------------------------------------------------

    def encode_prompt(self, prompt: Prompt, session: str = "") -> list[int]:
        """Token ids of the prompt; InvalidRequest if it is empty or too long. With a
        session id, the parts it shares with that session's last prompt are not
        tokenised again (SessionTokens): the same ids, sooner."""

        def encode(text: str) -> list[int]:
            return self.session_tokens.encode(text, session)

        if prompt.is_infill:
            if self.tokenizer.fim is None:
                raise InvalidRequest("infill", "this model has no fill-in-the-middle tokens")
            ids = self.tokenizer.encode_infill(prompt.prefix, prompt.suffix, prompt.path, encode)
            field_name = "infill"
        else:
            assert prompt.text is not None
            if not prompt.text:
                raise InvalidRequest("prompt", "must not be empty")
            ids = encode(prompt.text)
            field_name = "prompt"
        if len(ids) >= self.max_context:
            raise InvalidRequest(
                field_name,
                f"is {len(ids)} tokens; the context holds {self.max_context} "
                f"(prompt must be at most {self.max_context - 1} tokens)",
            )
        return ids

    def fresh_prompt_bytes(self, prompt: Prompt, session: str = "") -> int:
        """About how many bytes encode_prompt(prompt, session) would tokenise now: what
        the session's last prompts do not spare (the cost of tokenising it)."""
        parts = [prompt.path, prompt.prefix, prompt.suffix] if prompt.is_infill else [prompt.text]
        return sum(self.session_tokens.fresh_bytes(p, session) for p in parts if p)

    def submit(
        self,
        prompt_ids: list[int],
        params: GenerationParams,
        sink: Sink,
        request_id: str,
        session: str = "",
    ) -> Handle:
        """Queue a request; events go to sink from the engine thread."""
        if self.failure is not None:
            raise EngineUnavailable(f"engine failed: {type(self.failure).__name__}: {self.failure}")
        if self._stopping or self._finished:
            raise EngineUnavailable("engine is stopping")
        if not self.alive:
            raise EngineUnavailable("engine thread is not running")
        if not 1 <= params.max_tokens <= self.config.max_tokens_limit:
            raise InvalidRequest(
                "max_tokens", f"must be between 1 and {self.config.max_tokens_limit}"
            )
        limit = self.config.max_queue
        with self._waiting_lock:
            if self._waiting >= limit:
                raise QueueFull(
                    f"{limit} requests are already waiting (the queue holds at most {limit})"
                )
            self._waiting += 1
        handle = Handle(request_id, self._left_queue)
        self._queue.put_nowait(_Job(request_id, prompt_ids, params, sink, handle, session))
        if self._finished:  # the thread ended meanwhile: nobody else will answer it
            self._drain(EngineUnavailable("engine is not running"))
        return handle

    # -- the engine thread -------------------------------------------------

    def _run(self) -> None:
        try:
            started = time.perf_counter()
            self.versions = collect_versions(self.device)
            log.info("versions", extra={"versions": self.versions.__dict__})
            self.model = load_model(
                self.config.model_dir,
                dtype=self.dtype,
                device=self.device,
                quant=self.config.quant,
            )
            self.model.setup_cache(self.max_context)
            if self.device.type == "cuda":
                self._setup_gpu()
            else:
                self.kernel_paths = reference_paths(self.model, fallback=False)
            self._warm_up()
            if self.hooks.before_ready is not None:
                self.hooks.before_ready()
            if self.config.prefix_cache_entries > 0:
                caches = [layer.attention.cache for layer in self.model.layers]
                self.prefix = PrefixCache(
                    caches, self.config.prefix_cache_entries, self.config.prefix_cache_bytes
                )
            log.info("engine ready in %.2fs", time.perf_counter() - started)
            log.info("startup report", extra=startup_record(self))
            self.ready.set()
            self._settled.set()
        except BaseException as exc:
            self._fail("engine failed to start", exc)
            return
        self._notify(EngineState.READY)
        try:
            while (job := self._queue.get()) is not None:
                if job.handle.claim():
                    self._current = job
                    self._serve(job)
                    self._current = None
        except BaseException as exc:  # the thread is dying: answer everyone first
            self._fail("engine thread died", exc)
            return
        self._finished = True
        self._drain(EngineUnavailable("engine stopped"))
        self._notify(EngineState.STOPPED)

    def _fail(self, what: str, exc: BaseException) -> None:
        self.failure = exc
        self._finished = True
        self._settled.set()
        log.critical("%s", what, exc_info=exc)
        cause = EngineUnavailable(f"{what}: {type(exc).__name__}: {exc}")
        job, self._current = self._current, None
        if job is not None and not job.finished:
            self._emit(job, DoneEvent(FinishReason.ERROR, error=str(cause), cause=cause))
        self._drain(cause)
        self._notify(EngineState.FAILED)

    def _notify(self, state: EngineState) -> None:
        if self.hooks.on_state is not None:
            try:
                self.hooks.on_state(state)
            except Exception:
                log.exception("on_state hook failed for %s", state.value)

    def _drain(self, cause: EngineUnavailable) -> None:
        """End every request still queued: this thread will not run them."""
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                return
            if job is not None and job.handle.claim():
                self._emit(job, DoneEvent(FinishReason.ERROR, error=str(cause), cause=cause))

    def _warm_up(self) -> None:
        assert self.model is not None
        with torch.inference_mode():
            ids = torch.zeros((1, 8), dtype=torch.long, device=self.device)
            self.model(ids, torch.arange(8, device=self.device), 8, last_only=True)

    @staticmethod
    def _emit(job: _Job, event: Event) -> bool:
        if isinstance(event, DoneEvent):
            job.finished = True
        try:
            job.sink(event)
            return True
        except Exception:  # the receiver is gone: stop working for it
            log.warning(
                "sink failed; cancelling the request",
                exc_info=True,
                extra={"request_id": job.request_id},
            )
            job.handle.cancel()
            return False

    def _serve(self, job: _Job) -> None:
        try:
            with torch.inference_mode():
                self._generate(job)
        except Exception as exc:
            log.exception("request failed", extra={"request_id": job.request_id})
            self._emit(job, DoneEvent(FinishReason.ERROR, error=f"{type(exc).__name__}: {exc}"))

    def _setup_gpu(self) -> None:
        """Compute-capability check, fused Triton glue, the tuned GEMV, the kernel
        self-check, then graphs captured for every shape (engine/startup.py)."""
        from nib.engine.startup import setup_gpu

        setup_gpu(self)

    def _generate(self, job: _Job) -> None:
        start = time.perf_counter()
        queue_ms = (start - job.arrival) * 1e3
        if job.handle.cancelled:
            usage = Usage(prompt_tokens=len(job.prompt_ids))
            timings = Timings(queue_ms=queue_ms, arrival_unix_ms=unix_ms(job.arrival))
            self._emit(job, DoneEvent(job.handle.reason, usage, timings))
            return
        plan = self.healer.plan(job.prompt_ids) if self.healer else HealPlan(job.prompt_ids, "")
        prompt = plan.prompt_ids
        bias = self.healer.bias(plan.text, self.device) if self.healer and plan.text else None
        n = len(prompt)
        start = self.prefix.acquire(job.session, prompt) if self.prefix else 0
        if start and self.runner is not None and self.runner.chunk_for(start, n) is None:
            start = 0  # too many new tokens for a chunk graph: a full prefill is faster
        self.prompt_tokens_reused += start
        self.prompt_tokens_computed += n - start
        self.stats.requests += 1
        self.stats.prompt_tokens += n
        out = _Output(self, job, queue_ms, start, prompt, plan.text)
        budget = min(job.params.max_tokens, self.max_context - n)
        try:
            if self.runner is not None:
                self.runner.set_first_bias(bias)
                self._decode_gpu(job, out, budget, start, prompt)
            else:
                self._decode_cpu(job, out, budget, start, prompt, bias)
        except BaseException:
            if self.prefix:
                self.prefix.invalidate()
            raise
        if self.prefix:
            # Valid keys/values: the prompt and every generated token fed back as input.
            self.prefix.commit(job.session, prompt + out.token_ids[:-1])
        out.done()

    def _decode_cpu(
        self,
        job: _Job,
        out: _Output,
        budget: int,
        start: int,
        prompt: list[int],
        bias: torch.Tensor | None,
    ) -> None:
        assert self.model is not None
        model, n, params = self.model, len(prompt), job.params
        sampler = Sampler(params, self.device)
        spec = Speculator(self.speculative_k)
        ids = torch.tensor([prompt[start:]], dtype=torch.long, device=self.device)
        logits = model(ids, torch.arange(start, n, device=self.device), n, last_only=True)
        row = logits[0, -1].float()
        token_id = int(sampler(row if bias is None else row + bias))
        history = [*prompt, token_id]
        if not out.token(token_id, self._logprob(row, token_id, params)):
            return
        pos, produced = n, 1  # token_id sits at pos, not yet fed to the model
        try:
            while produced < budget:
                draft = spec.draft(history, budget - produced)
                inputs = torch.tensor([[token_id, *draft]], device=self.device)
                positions = torch.arange(pos, pos + 1 + len(draft), device=self.device)
                rows = model(inputs, positions, pos + 1 + len(draft))[0].float()
                if draft:
                    if params.greedy:
                        tokens = accept_greedy(rows.argmax(-1), draft)
                    else:
                        assert sampler.generator is not None
                        tokens = accept_sampled(rows, draft, params, sampler.generator)
                    spec.record(len(draft), len(tokens) - 1)
                else:
                    tokens = [int(sampler(rows[0]))]
                for i, t in enumerate(tokens[: budget - produced]):
                    produced += 1
                    history.append(t)
                    if not out.token(t, self._logprob(rows[i], t, params)):
                        return
                pos += len(tokens)
                token_id = tokens[-1]
        finally:
            self._count_speculation(spec)

    def _count_speculation(self, spec: Speculator) -> None:
        stats = self.speculation_stats
        stats["verifies"] += spec.verifies
        stats["drafted"] += spec.drafted
        stats["accepted"] += spec.accepted

    @staticmethod
    def _logprob(row: torch.Tensor, token_id: int, params: GenerationParams) -> float:
        return float(row.log_softmax(-1)[token_id]) if params.logprobs else 0.0

    def _decode_gpu(
        self, job: _Job, out: _Output, budget: int, start: int, prompt: list[int]
    ) -> None:
        """The runner launches step n+1 before handing over token n, so detokenising,
        stop checks and streaming overlap the GPU's work (see GraphRunner.generate)."""
        runner, params = self.runner, job.params
        assert runner is not None
        if not params.greedy:
            seed = (
                params.seed if params.seed is not None else int.from_bytes(os.urandom(7), "little")
            )
            runner.set_sampling(params, seed)
        if params.greedy and self.speculative_k > 0:
            spec = Speculator(self.speculative_k, costs=runner.verify_costs)
            tokens = runner.generate_speculative(prompt, budget, start, spec)
        else:
            spec = None  # sampling on the GPU decodes without drafts (see speculative.py)
            tokens = runner.generate(prompt, params.greedy, budget, start)
        try:
            for token_id, logprob in tokens:
                if not out.token(token_id, logprob):
                    return
        finally:
            if spec is not None:
                self._count_speculation(spec)


class _Output:
    """Turns sampled token ids into events: detokenising, stop strings, EOS,
    cancellation, timings. token() returns False when generation must end."""

    def __init__(
        self,
        engine: Engine,
        job: _Job,
        queue_ms: float,
        cached: int,
        prompt: list[int],
        healed: str,
    ) -> None:
        self.engine, self.job, self.queue_ms, self.cached = engine, job, queue_ms, cached
        self.token_ids: list[int] = []
        self.detok = IncrementalDetokenizer(engine.tokenizer, prompt)
        self.healed = HealedText(healed)
        self.stops = StopMatcher(job.params.stop)
        self.stamps: list[float] = []
        self.completion = 0
        self.finish, self.stop_hit = FinishReason.LENGTH, ""

    def token(self, token_id: int, logprob: float) -> bool:
        job = self.job
        if token_id in self.engine.tokenizer.eos_token_ids:
            self.finish = FinishReason.END_OF_TEXT
            return False
        self.completion += 1
        self.engine.stats.generated_tokens += 1
        self.token_ids.append(token_id)
        text, stop = self.stops.feed(self.healed(self.detok.push(token_id)))
        self.stamps.append(time.perf_counter())
        lp = (logprob,) if job.params.logprobs else ()
        if not self.engine._emit(job, TokenEvent(text, (token_id,), lp)):
            self.finish = job.handle.reason
            return False
        if stop is not None:
            self.finish, self.stop_hit = FinishReason.STOP, stop
            return False
        if job.handle.cancelled:
            self.finish = job.handle.reason
            return False
        hook = self.engine.hooks.before_step
        if hook is not None:
            hook(job.request_id, self.completion)
        return True

    def done(self) -> None:
        job = self.job
        if self.finish in (FinishReason.LENGTH, FinishReason.END_OF_TEXT):
            rest, stop = self.stops.flush()
            if rest:
                self.engine._emit(job, TokenEvent(rest, ()))
            if stop is not None:
                self.finish, self.stop_hit = FinishReason.STOP, stop
        end = time.perf_counter()
        stamps = self.stamps
        timings = Timings(
            queue_ms=self.queue_ms,
            ttft_ms=((stamps[0] if stamps else end) - job.arrival) * 1e3,
            total_ms=(end - job.arrival) * 1e3,
            inter_token_ms=tuple((b - a) * 1e3 for a, b in itertools.pairwise(stamps)),
            arrival_unix_ms=unix_ms(job.arrival),
        )
        usage = Usage(len(job.prompt_ids), self.completion, cached_prompt_tokens=self.cached)
        self.engine._emit(job, DoneEvent(self.finish, usage, timings, stop=self.stop_hit))
