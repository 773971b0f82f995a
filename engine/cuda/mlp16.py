"""The decoder's feed-forward block for one token in one launch (mlp16.cu): configs,
argument struct, buffers, launches, and the float64 reference.

    h += W_down (silu(gate) * up),   [gate; up] = W_gate_up (rms_norm(h) * nw)

gemv16.cu runs this as two kernels (norm + GLU, then the residual down projection);
mlp16.cu lets each warp go from its gate/up rows to its down rows without a kernel
boundary, the down product split along K by chunks of the GLU output and each split
waiting only for its own chunk (see the .cu file for the schedule and why it cannot
deadlock). The grid is exactly what fits on the GPU at once (the occupancy API), which
the schedule relies on.

Napkin math (Qwen2.5-Coder-1.5B, bf16): gate/up 55.1 MB + down 27.5 MB = 82.6 MB a
layer; at 4.28 TB/s that is 19.3 us (gemv16.cu's two kernels, timed alone: 16.8 + 11.4
us, bench/results/2026-12-01-micro-gemv16.json).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

CHUNK = 8  # 16-bit values per 16-byte load
STRIDE = 32 * CHUNK  # inputs a warp covers per load of one row
MAX_K = 16384  # the staged fp32 activations: 2 x 32 KB of shared memory at most
MAX_PART_SLOTS = 4  # mlp16.cu: a finishing warp gathers (S - 1) x RD <= 32 x this partials
SCRATCH = 128  # bytes of shared memory before the activations (block_sum)


@dataclass(frozen=True)
class Mlp16Config:
    """One instantiation: `rows` GLU outputs per phase-1 group with `unroll` 16-byte loads
    per weight row in flight per lane; `down_rows` rows per down task over a chunk of
    `chunk_loads` x 256 GLU values; `warps` per block, registers capped for
    `min_blocks` blocks per SM."""

    rows: int = 2
    warps: int = 8
    unroll: int = 4
    down_rows: int = 4
    chunk_loads: int = 2
    min_blocks: int = 2

    @property
    def chunk(self) -> int:
        return self.chunk_loads * STRIDE

    def label(self) -> str:
        return (
            f"cuda mlp16 r{self.rows}w{self.warps}u{self.unroll}"
            f"d{self.down_rows}c{self.chunk_loads}b{self.min_blocks}"
        )


# The instantiations in mlp16.cu (MLP_BOTH), in its order.
CONFIGS = (
    Mlp16Config(2, 8, 4, 4, 2, 2),
    Mlp16Config(1, 8, 4, 4, 2, 2),
    Mlp16Config(1, 4, 4, 4, 2, 4),
    Mlp16Config(2, 4, 4, 4, 2, 4),
    Mlp16Config(2, 8, 4, 2, 4, 1),
    Mlp16Config(1, 8, 8, 2, 4, 1),
)


def kernel_name(cfg: Mlp16Config, dtype: torch.dtype) -> str:
    if cfg not in CONFIGS:
        raise ValueError(f"mlp16: no kernel for {cfg}")
    dt = "bf16" if dtype == torch.bfloat16 else "fp16"
    return (
        f"mlp16_{dt}_r{cfg.rows}w{cfg.warps}u{cfg.unroll}"
        f"d{cfg.down_rows}c{cfg.chunk_loads}b{cfg.min_blocks}"
    )


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Geometry:
    """What the kernel derives from MlpArgs, computed here once."""

    groups_gu: int  # phase-1 groups of cfg.rows GLU outputs
    groups_d: int  # down row groups of cfg.down_rows rows
    splits: int  # chunks of the GLU output (down's split K)
    shared: int  # dynamic shared memory bytes


def geometry(k: int, f: int, cfg: Mlp16Config) -> Geometry:
    n_it = _cdiv(k // CHUNK, 32 * cfg.unroll) * cfg.unroll  # loads per row per lane, padded
    shared = SCRATCH + 2 * (n_it * 32) * 16
    return Geometry(_cdiv(f, cfg.rows), _cdiv(k, cfg.down_rows), _cdiv(f, cfg.chunk), shared)


def shape_rule(k: int, f: int, dtype: torch.dtype, cfg: Mlp16Config) -> str:
    """'' if mlp16.cu takes a block of hidden size k and intermediate size f, else the
    rule it breaks."""
    if dtype not in (torch.bfloat16, torch.float16):
        return f"dtype {dtype} is not bf16 or fp16"
    if k < CHUNK or k % CHUNK or k > MAX_K:
        return f"hidden size {k} is not a multiple of {CHUNK} up to {MAX_K}"
    if f < CHUNK or f % CHUNK:
        return f"intermediate size {f} is not a multiple of {CHUNK}"
    geo = geometry(k, f, cfg)
    if (geo.splits - 1) * cfg.down_rows > 32 * MAX_PART_SLOTS:
        return (
            f"{geo.splits} chunks of {cfg.chunk} x {cfg.down_rows} rows is more partials than "
            f"a warp gathers ({32 * MAX_PART_SLOTS})"
        )
    return ""


def supports(w_gate_up: torch.Tensor, w_down: torch.Tensor, cfg: Mlp16Config) -> str:
    """'' if mlp16.cu can run this pair of weights with cfg, else the rule it breaks."""
    for name, w in (("gate_up", w_gate_up), ("down", w_down)):
        if w.dim() != 2 or w.device.type != "cuda":
            return f"{name} weight is not a 2-D CUDA tensor"
        if not w.is_contiguous() or w.data_ptr() % 16:
            return f"{name} weight is not contiguous and 16-byte aligned"
    two_f, k = w_gate_up.shape
    if two_f % 2 or tuple(w_down.shape) != (k, two_f // 2):
        return (
            f"gate_up {tuple(w_gate_up.shape)} and down {tuple(w_down.shape)} are not "
            f"[2F, K] and [K, F]"
        )
    if w_down.dtype != w_gate_up.dtype:
        return "gate_up and down weights differ in dtype"
    return shape_rule(k, two_f // 2, w_gate_up.dtype, cfg)


class MlpArgs(ctypes.Structure):
    _fields_ = [
        ("wgu", ctypes.c_void_p), ("wd", ctypes.c_void_p), ("nw", ctypes.c_void_p),
        ("h", ctypes.c_void_p), ("act", ctypes.c_void_p), ("part", ctypes.c_void_p),
        ("sync", ctypes.c_void_p),
        ("k", ctypes.c_int), ("f", ctypes.c_int), ("groups_gu", ctypes.c_int),
        ("groups_d", ctypes.c_int), ("splits", ctypes.c_int), ("eps", ctypes.c_float),
    ]  # fmt: skip


class Mlp16:
    """One feed-forward block's fused kernel: its weights, config, and the buffers its
    launches hand values through (kept for the block's life: a captured graph holds
    their addresses)."""

    def __init__(
        self,
        w_gate_up: torch.Tensor,
        w_down: torch.Tensor,
        cfg: Mlp16Config,
        blocks: int | None = None,
    ) -> None:
        why = supports(w_gate_up, w_down, cfg)
        if why:
            raise ValueError(f"mlp16: {why}")
        from nib.engine.cuda.loader import module, pdl

        self.w_gate_up, self.w_down, self.cfg = w_gate_up, w_down, cfg
        self.k = w_gate_up.shape[1]
        self.f = w_gate_up.shape[0] // 2
        self.geo = geometry(self.k, self.f, cfg)
        device = w_gate_up.device
        # Zeroed: tag 0 never matches a launch's tag (generation + 1 >= 1).
        self.act = torch.zeros(self.f, dtype=torch.int32, device=device)
        self.part = torch.zeros(max(self.geo.splits - 1, 1) * self.k, dtype=torch.int64,
                                device=device)  # fmt: skip
        # [0] generation, [1] blocks that have left, [2] waits given up (must stay 0).
        self.sync = torch.zeros(3, dtype=torch.int32, device=device)
        self.kernel = module("mlp16.cu", device).kernel(kernel_name(cfg, w_gate_up.dtype))
        threads = cfg.warps * 32
        per_sm = self.kernel.blocks_per_sm(threads, self.geo.shared)
        if per_sm < 1:
            raise ValueError(f"mlp16: {cfg.label()} does not fit on an SM of this GPU")
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        # Every block must be resident at once (the schedule waits across blocks).
        self.blocks = sms * per_sm
        if blocks is not None:  # diagnostics: a grid larger than this may never finish
            self.blocks = blocks
        self.pdl = pdl(device)

    def gave_up(self) -> int:
        """Nonzero if a launch's wait gave up (1: GLU outputs, 2: down partials): the
        result is then wrong. Synchronises with the device."""
        return int(self.sync[2])

    @property
    def weight_bytes(self) -> int:
        return (self.w_gate_up.numel() + self.w_down.numel()) * self.w_gate_up.element_size()

    def run(self, h: torch.Tensor, norm_weight: torch.Tensor, eps: float) -> None:
        """h += W_down (silu(gate) * up) of rms_norm(h) * norm_weight, in place (one row)."""
        dt = self.w_gate_up.dtype
        for name, t in (("h", h), ("norm weight", norm_weight)):
            if (
                t.dtype != dt
                or t.numel() != self.k
                or not t.is_contiguous()
                or t.data_ptr() % 16
                or t.device != self.w_gate_up.device
            ):
                raise ValueError(
                    f"mlp16: {name} must be one contiguous, 16-byte aligned row of {self.k} "
                    f"{dt} values on {self.w_gate_up.device}"
                )
        from nib.engine.cuda.driver import ptr

        geo = self.geo
        args = MlpArgs(
            ptr(self.w_gate_up), ptr(self.w_down), ptr(norm_weight), ptr(h), ptr(self.act),
            ptr(self.part), ptr(self.sync), self.k, self.f, geo.groups_gu, geo.groups_d,
            geo.splits, eps,
        )  # fmt: skip
        self.kernel.launch((self.blocks,), (self.cfg.warps * 32,), args, geo.shared, pdl=self.pdl)


def candidates(w_gate_up: torch.Tensor, w_down: torch.Tensor) -> list[Mlp16Config]:
    """The instantiations that take this pair of weights."""
    return [c for c in CONFIGS if supports(w_gate_up, w_down, c) == ""]


def reference(
    h: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
) -> torch.Tensor:
    """The new h, in float64 with the kernel's rounding points (gemv16.reference's, for
    its two kernels in turn)."""
    from nib.engine.cuda.gemv16 import reference as gemv_ref

    act = gemv_ref(h, w_gate_up, norm_weight=norm_weight, eps=eps, glu=True)
    return gemv_ref(act, w_down, residual=h)
