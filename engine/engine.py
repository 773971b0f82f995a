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
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from nib.engine.config import ModelConfig
from nib.engine.errors import EngineUnavailable, InvalidRequest, QueueFull
from nib.engine.handle import Handle
from nib.engine.hooks import EngineHooks, EngineState
from nib.engine.loader import load_model
from nib.engine.model import Transformer
from nib.engine.request import (
    DoneEvent,
    Event,
    FinishReason,
    GenerationParams,
    Prompt,
    Timings,
    TokenEvent,
    Usage,
)
from nib.engine.sampling import Sampler
from nib.engine.stats import EngineStats
from nib.engine.tokenizer import IncrementalDetokenizer, StopMatcher, Tokenizer

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

    @property
    def torch_dtype(self) -> torch.dtype:
        if self.dtype == "auto":
            return torch.float32 if self.device == "cpu" else torch.bfloat16
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


@dataclass
class _Job:
    request_id: str
    prompt_ids: list[int]
    params: GenerationParams
    sink: Sink
    handle: Handle
    arrival: float = field(default_factory=time.perf_counter)
    finished: bool = False  # its DoneEvent was sent


class Engine:
    def __init__(self, config: EngineConfig, hooks: EngineHooks | None = None) -> None:
        self.config = config
        self.hooks = hooks or EngineHooks()
        self.stats = EngineStats()
        self.model_config = ModelConfig.from_dir(config.model_dir)
        self.tokenizer = Tokenizer(config.model_dir, self.model_config.eos_token_ids)
        self.max_context = min(config.max_context, self.model_config.max_position_embeddings)
        if self.model_config.sliding_window:
            self.max_context = min(self.max_context, self.model_config.sliding_window)
        self.device = torch.device(config.device)
        self.dtype = config.torch_dtype
        self.model: Transformer | None = None
        self.ready = threading.Event()
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
        return self.ready.wait(timeout)

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
            quantization="none",
            max_tokens_limit=self.config.max_tokens_limit,
            supports_infill=self.tokenizer.fim is not None,
        )

    # -- requests ----------------------------------------------------------

    def encode_prompt(self, prompt: Prompt) -> list[int]:
        """Token ids of the prompt; InvalidRequest if it is empty or too long."""
        if prompt.is_infill:
            if self.tokenizer.fim is None:
                raise InvalidRequest("infill", "this model has no fill-in-the-middle tokens")
            ids = self.tokenizer.encode_infill(prompt.prefix, prompt.suffix, prompt.path)
            field_name = "infill"
        else:
            assert prompt.text is not None
            if not prompt.text:
                raise InvalidRequest("prompt", "must not be empty")
            ids = self.tokenizer.encode(prompt.text)
            field_name = "prompt"
        if len(ids) >= self.max_context:
            raise InvalidRequest(
                field_name,
                f"is {len(ids)} tokens; the context holds {self.max_context} "
                f"(prompt must be at most {self.max_context - 1} tokens)",
            )
        return ids

    def submit(
        self, prompt_ids: list[int], params: GenerationParams, sink: Sink, request_id: str
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
        self._queue.put_nowait(_Job(request_id, prompt_ids, params, sink, handle))
        if self._finished:  # the thread ended meanwhile: nobody else will answer it
            self._drain(EngineUnavailable("engine is not running"))
        return handle

    # -- the engine thread -------------------------------------------------

    def _run(self) -> None:
        try:
            started = time.perf_counter()
            self.model = load_model(self.config.model_dir, dtype=self.dtype, device=self.device)
            self.model.setup_cache(self.max_context)
            self._warm_up()
            if self.hooks.before_ready is not None:
                self.hooks.before_ready()
            log.info("engine ready in %.2fs", time.perf_counter() - started)
            self.ready.set()
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

    def _generate(self, job: _Job) -> None:
        assert self.model is not None
        model, tok, params = self.model, self.tokenizer, job.params
        start = time.perf_counter()
        queue_ms = (start - job.arrival) * 1e3
        n_prompt = len(job.prompt_ids)
        usage = Usage(prompt_tokens=n_prompt)
        if job.handle.cancelled:
            self._emit(job, DoneEvent(job.handle.reason, usage, Timings(queue_ms=queue_ms)))
            return

        self.stats.requests += 1
        self.stats.prompt_tokens += n_prompt
        sampler = Sampler(params, self.device)
        detok = IncrementalDetokenizer(tok, job.prompt_ids)
        stops = StopMatcher(params.stop)
        budget = min(params.max_tokens, self.max_context - n_prompt)
        stamps: list[float] = []
        finish, stop_hit = FinishReason.LENGTH, ""
        completion = 0

        ids = torch.tensor([job.prompt_ids], dtype=torch.long, device=self.device)
        logits = model(ids, torch.arange(n_prompt, device=self.device), n_prompt, last_only=True)
        pos = n_prompt
        for step in range(budget):
            row = logits[0, -1].float()
            token = sampler(row)
            token_id = int(token.item())
            if token_id in tok.eos_token_ids:
                finish = FinishReason.END_OF_TEXT
                break
            completion += 1
            self.stats.generated_tokens += 1
            text, stop_hit_or_none = stops.feed(detok.push(token_id))
            logprob = (float(row.log_softmax(-1)[token_id]),) if params.logprobs else ()
            stamps.append(time.perf_counter())
            if not self._emit(job, TokenEvent(text, (token_id,), logprob)):
                finish = job.handle.reason
                break
            if stop_hit_or_none is not None:
                finish, stop_hit = FinishReason.STOP, stop_hit_or_none
                break
            if job.handle.cancelled:
                finish = job.handle.reason
                break
            if step + 1 == budget:
                break
            if self.hooks.before_step is not None:
                self.hooks.before_step(job.request_id, completion)
            logits = model(token.view(1, 1), torch.tensor([pos], device=self.device), pos + 1)
            pos += 1
        if finish in (FinishReason.LENGTH, FinishReason.END_OF_TEXT):
            rest = stops.flush()
            if rest:
                self._emit(job, TokenEvent(rest, ()))
        end = time.perf_counter()
        timings = Timings(
            queue_ms=queue_ms,
            ttft_ms=((stamps[0] if stamps else end) - job.arrival) * 1e3,
            total_ms=(end - job.arrival) * 1e3,
            inter_token_ms=tuple((b - a) * 1e3 for a, b in itertools.pairwise(stamps)),
        )
        usage = Usage(prompt_tokens=n_prompt, completion_tokens=completion)
        self._emit(job, DoneEvent(finish, usage, timings, stop=stop_hit))
