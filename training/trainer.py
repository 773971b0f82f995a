"""The training loop: a Hugging Face LlamaForCausalLM trained from scratch against a deadline.

AdamW, linear warmup then cosine decay, gradient clipping, bf16 autocast on a
GPU. The number of steps is fixed before the first update: a short timing probe
measures a step and the schedule is sized to the wall-clock budget (or given
with --steps, which reproduces a run exactly). A hard deadline still ends the
loop early if the machine slows down, so a run always gets to saving.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

from training.dataset import ChunkSampler
from training.shapes import ModelShape


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite."""


@dataclass(frozen=True)
class TrainConfig:
    seq_len: int = 1024
    batch_size: int = 128
    lr: float = 1.5e-3
    min_lr_ratio: float = 0.1
    warmup_fraction: float = 0.03
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    seed: int = 1234
    evals: int = 20  # held-out loss measurements over the run (the loss curve)
    eval_batches: int = 4
    probe_steps: int = 6
    compile: bool = False


@dataclass
class CurvePoint:
    step: int
    tokens: int
    seconds: float
    lr: float
    train_loss: float
    heldout_loss: float


@dataclass
class TrainResult:
    model: LlamaForCausalLM | None
    steps: int
    planned_steps: int
    warmup_steps: int
    tokens: int
    epochs: float
    seconds: float
    step_seconds: float
    stopped_by_deadline: bool
    selected_step: int  # the step whose weights are returned: the lowest held-out loss
    curve: list[CurvePoint] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "planned_steps": self.planned_steps,
            "warmup_steps": self.warmup_steps,
            "tokens": self.tokens,
            "epochs": self.epochs,
            "seconds": self.seconds,
            "step_seconds": self.step_seconds,
            "tokens_per_second": self.tokens / max(self.seconds, 1e-9),
            "stopped_by_deadline": self.stopped_by_deadline,
            "selected_step": self.selected_step,
            "curve": [asdict(p) for p in self.curve],
        }


@dataclass
class _Best:
    heldout_loss: float = math.inf
    step: int = -1
    state: dict[str, torch.Tensor] | None = None


def _fit(seconds: float, step_s: float, safety: float = 0.97) -> int:
    """How many steps of step_s fit in seconds, with a margin."""
    return max(1, int(safety * seconds / step_s))


def lr_at(step: int, total: int, cfg: TrainConfig, warmup: int | None = None) -> float:
    """Linear warmup to cfg.lr, then cosine decay to cfg.lr * min_lr_ratio at `total`."""
    if warmup is None:
        warmup = max(1, int(cfg.warmup_fraction * total))
    if step < warmup:
        return cfg.lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + 0.5 * (cfg.lr - floor) * (1 + math.cos(math.pi * progress))


def build_model(
    shape: ModelShape, eos_id: int, device: torch.device, seed: int
) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    # SDPA: FlashAttention kernels on the GPU for bf16 and head_dim 64.
    config = LlamaConfig(**shape.hf_config(eos_id), attn_implementation="sdpa")
    return LlamaForCausalLM(config).to(device)


def _optimizer(model: torch.nn.Module, cfg: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    # Decay matrices (the embedding too, as it is also the output layer); not the norm weights.
    decay = [p for p in model.parameters() if p.ndim >= 2]
    keep = [p for p in model.parameters() if p.ndim < 2]
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": keep, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(
        groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), fused=device.type == "cuda"
    )


def _autocast(device: torch.device) -> contextlib.AbstractContextManager[Any]:
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()  # the CPU smoke run stays in fp32


def train(
    shape: ModelShape,
    cfg: TrainConfig,
    train_stream: np.ndarray,
    heldout_stream: np.ndarray,
    eos_id: int,
    device: torch.device,
    seconds: float,
    steps: int | None = None,
    log: Callable[[str], None] = print,
    warmup_steps: int | None = None,
) -> TrainResult:
    """Train for `steps` steps, or as many as fit in `seconds` (measured by a probe)."""
    # The clock starts now: building the model includes CUDA's start-up, seconds on a cold GPU.
    deadline = time.monotonic() + seconds
    torch.manual_seed(cfg.seed)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    model = build_model(shape, eos_id, device, cfg.seed)
    model.train()
    sampler = ChunkSampler(train_stream, cfg.seq_len, cfg.batch_size, device, cfg.seed)
    # The held-out split may be small (smoke runs, capped corpora): fewer windows per batch then.
    held_batch = min(cfg.batch_size, (heldout_stream.size - cfg.seq_len) // (cfg.seq_len + 1))
    if held_batch < 1:
        raise ValueError(
            f"the held-out stream ({heldout_stream.size} tokens) is shorter than one window"
        )
    held = ChunkSampler(heldout_stream, cfg.seq_len, held_batch, device, cfg.seed + 1)
    heldout_batches = [held.next_batch() for _ in range(cfg.eval_batches)]
    opt = _optimizer(model, cfg, device)
    forward: list[Callable[..., Any]] = [torch.compile(model) if cfg.compile else model]

    def loss_of(
        x: torch.Tensor, y: torch.Tensor, fn: Callable[..., Any] | None = None
    ) -> torch.Tensor:
        with _autocast(device):
            logits = (fn or forward[0])(input_ids=x, use_cache=False).logits
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.reshape(-1))

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    @torch.no_grad()
    def heldout_loss() -> float:
        model.eval()
        # Eager even with --compile: an eval-mode graph would cost a second compilation.
        total = sum(float(loss_of(x, y, model)) for x, y in heldout_batches)
        model.train()
        return total / len(heldout_batches)

    planned_by_time = steps is None
    if steps is None:
        # Forward + backward without updates on one batch: compiles, warms the kernels, times a step.
        x, y = sampler.first_batch()
        if cfg.compile:
            try:
                loss_of(x, y).backward()
            except Exception as exc:  # a failed compilation must not cost the run
                log(f"torch.compile failed ({type(exc).__name__}: {exc}); training eagerly")
                forward[0] = model
        times = []
        for _ in range(cfg.probe_steps):
            sync()
            t = time.monotonic()
            loss_of(x, y).backward()
            sync()
            times.append(time.monotonic() - t)
        opt.zero_grad(set_to_none=True)
        step_s = float(np.median(times[len(times) // 2 :]))
        # A held-out measurement is forward only, about a third of a step per batch.
        eval_s = step_s / 3 * len(heldout_batches) * cfg.evals
        steps = _fit(deadline - time.monotonic() - eval_s, step_s)
        log(
            f"probe: {step_s * 1e3:.1f} ms/step ({cfg.batch_size * cfg.seq_len / step_s:,.0f} "
            f"tokens/s); planning {steps} steps"
        )
    # Warmup is fixed by the first plan; a re-plan while still warming up moves only the end.
    warmup = warmup_steps or max(1, int(cfg.warmup_fraction * steps))
    replan_at = max(5, warmup // 2) if planned_by_time and max(5, warmup // 2) < steps else -1
    eval_every = max(1, steps // cfg.evals)
    curve: list[CurvePoint] = []
    running = torch.zeros((), device=device)
    since_eval = 0
    step = 0
    lr = 0.0
    eval_seconds = 0.0
    t0 = time.monotonic()

    def record() -> None:
        nonlocal since_eval, eval_seconds
        train_loss = float(running) / since_eval
        if not math.isfinite(train_loss):
            raise TrainingDiverged(f"training loss is {train_loss} at step {step}")
        t = time.monotonic()
        point = CurvePoint(
            step=step,
            tokens=step * cfg.batch_size * cfg.seq_len,
            seconds=t - t0,
            lr=lr,
            train_loss=train_loss,
            heldout_loss=heldout_loss(),
        )
        curve.append(point)
        if point.heldout_loss < best.heldout_loss:
            best.heldout_loss, best.step = point.heldout_loss, step
            best.state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        eval_seconds += time.monotonic() - t
        running.zero_()
        since_eval = 0
        log(
            f"step {step}/{steps} {point.seconds:.0f}s lr {lr:.2e} train {train_loss:.3f} "
            f"heldout {point.heldout_loss:.3f} epoch {sampler.epochs_done:.2f}"
        )

    best = _Best()
    stopped = False
    while step < steps:
        if time.monotonic() >= deadline:
            stopped = True
            log(f"deadline reached at step {step} of {steps}: stopping early")
            break
        lr = lr_at(step, steps, cfg, warmup)
        for group in opt.param_groups:
            group["lr"] = lr
        x, y = sampler.next_batch()
        loss = loss_of(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        running += loss.detach()
        since_eval += 1
        step += 1
        if step == replan_at:
            # Real steps (optimizer, clipping, sampling included) are the better clock.
            sync()
            step_s = (time.monotonic() - t0 - eval_seconds) / step
            per_eval = eval_seconds / len(curve) if curve else step_s / 3 * len(heldout_batches)
            left = deadline - time.monotonic() - per_eval * (cfg.evals + 1 - len(curve))
            steps = max(step + 1, step + _fit(left, step_s))
            eval_every = max(1, steps // cfg.evals)
            log(f"re-planned after {step} steps at {step_s * 1e3:.1f} ms/step: {steps} steps")
        if step % eval_every == 0:
            record()
    if since_eval:
        record()
    if best.step != step and best.state is not None:
        # Only if the held-out loss rose at the end (over-fitting): ship the better weights.
        log(f"restoring step {best.step} (held-out {best.heldout_loss:.3f}): it beat the last step")
        model.load_state_dict(best.state)
    sync()
    elapsed = time.monotonic() - t0
    tokens = step * cfg.batch_size * cfg.seq_len
    model.eval()
    return TrainResult(
        model=model,
        steps=step,
        planned_steps=steps,
        warmup_steps=warmup,
        tokens=tokens,
        epochs=tokens / train_stream.size,
        seconds=elapsed,
        step_seconds=elapsed / max(1, step),
        stopped_by_deadline=stopped,
        selected_step=best.step,
        curve=curve,
    )
