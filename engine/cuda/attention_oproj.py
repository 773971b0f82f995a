"""The decode attention with the layer's INT4 output projection fused behind it.

attention.cu's `_oproj` kernels (sm_90) do in one launch what the decode step
otherwise does in two: RoPE + KV-cache write + split-K attention (the cluster
merge of attention.py), then `residual += W_o out` with W_o in w4a16.py's mma16
packing. It applies where every KV head's splits fit in one thread-block cluster
(at most 16 blocks, a non-portable size that the GPU is asked about) and the
o_proj's 16-row tiles split evenly over those blocks, each block holding its
share in registers before the wait (Qwen2.5-1.5B: 2 KV heads x 8 splits, 6 tiles
x 12 groups a block). The weights load while the q/k/v GEMV finishes; after the
attention the KV heads' first blocks push the output as fp16 into every block's
shared memory, and every block adds its tiles to the residual stream.

The products are summed in the order of w4a16.cu's one-row kernel with
`order_warps` warps and no K split, so the result equals, bit for bit, the
attention kernel followed by that GEMV (tests/gpu/test_cuda_attention_oproj.py).
`oproj_for_model` builds it where it applies and says why not elsewhere; the
decode graphs use it where start-up's step tuning measured it faster
(GraphRunner.fuse_oproj, engine/step_tuning.py).
"""

from __future__ import annotations

import ctypes
import math
from typing import Any

import torch

from nib.engine.cuda.attention import (
    CLUSTER_CAPABILITY,
    DTYPES,
    MAX_CLUSTER,
    RopeAttnArgs,
    default_splits,
    shared_bytes,
    unsupported,
)

WARPS = 8  # the `_oproj` kernels' block
PAIRS_PER_WARP = 9  # attention.cu's OPROJ_PAIRS: (tile, group) pairs a warp holds
MAX_BLOCKS = 16  # the largest (non-portable) cluster on sm_90
TILE = 16  # o_proj rows per tile (w4a16.py)
# Where the o_proj's weights wait for the attention (attention.cu's OPROJ): "registers"
# loaded at the start, "l2" prefetched into L2 by the copy engine at the start and
# loaded into registers once the block's positions are attended.
MODES = {"registers": "_oproj", "l2": "_oprojl2"}
GROUP = 128  # inputs per scale group


class OprojArgs(ctypes.Structure):
    _fields_ = [
        ("attn", RopeAttnArgs), ("qw", ctypes.c_void_p), ("sc", ctypes.c_void_p),
        ("bias", ctypes.c_void_p), ("y", ctypes.c_void_p), ("tiles_per_block", ctypes.c_int),
        ("order_warps", ctypes.c_int),
    ]  # fmt: skip


def _index(device: torch.device) -> int:
    d = torch.device(device)
    return d.index if d.index is not None else torch.cuda.current_device()


def tiles_per_block(
    num_heads: int, num_kv_heads: int, head_dim: int, hidden: int, splits: int
) -> tuple[int, str]:
    """(o_proj tiles each block of the cluster owns, '') or (0, the rule the shape breaks)."""
    why = unsupported(num_heads, num_kv_heads, head_dim, torch.float16)
    if why:
        return 0, why
    blocks = splits * num_kv_heads
    if not 1 <= splits <= MAX_CLUSTER or blocks > MAX_BLOCKS:
        return 0, (
            f"{num_kv_heads} KV heads x {splits} splits is not a cluster of at most "
            f"{MAX_BLOCKS} blocks with 1..{MAX_CLUSTER} splits a head"
        )
    k = num_heads * head_dim
    if k % GROUP:
        return 0, f"o_proj in_features {k} is not a multiple of {GROUP}"
    if hidden % (TILE * blocks):
        return 0, f"hidden {hidden} does not split into {TILE}-row tiles over {blocks} blocks"
    tpb = hidden // TILE // blocks
    pairs = tpb * (k // GROUP)
    if pairs > WARPS * PAIRS_PER_WARP:
        return 0, (
            f"{tpb} tiles x {k // GROUP} groups a block is above the {WARPS * PAIRS_PER_WARP} "
            "pairs its warps hold in registers"
        )
    return tpb, ""


def order_warps(packed: Any) -> int:
    """The warp count whose summation order the fused o_proj follows: that of the layer's
    one-row config where it runs without a K split (then the two paths agree bit for
    bit), else 8."""
    cfg = packed.effective(packed.one_row, 1)
    return int(cfg.warps) if cfg.splits == 1 else WARPS


class FusedAttentionOproj:
    """The fused decode attention plus o_proj for one model shape; graph-safe. Call it as
    `fused(qkv, positions, cos, sin, k_cache, v_cache, packed, residual)` with the
    arguments of FusedDecodeAttention, the layer's CudaInt4 o_proj (`packed`) and the
    residual stream [hidden] (updated in place); `supports(packed)` says first whether
    a layer's o_proj can run in it."""

    def __init__(
        self,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        hidden: int,
        max_context: int,
        dtype: torch.dtype,
        device: torch.device,
        *,
        splits: int | None = None,
        mode: str = "l2",
    ) -> None:
        why = unsupported(num_heads, num_kv_heads, head_dim, dtype)
        if why:
            raise ValueError(f"fused attention + o_proj: {why}")
        if mode not in MODES:
            raise ValueError(f"fused attention + o_proj: mode {mode!r} is not one of {MODES}")
        self.mode = mode
        if torch.cuda.get_device_capability(device) < CLUSTER_CAPABILITY:
            raise ValueError("fused attention + o_proj: needs sm_90 (thread-block clusters)")
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.group = num_heads // num_kv_heads
        self.hidden, self.max_context = hidden, max_context
        self.dtype, self.device = dtype, device
        if splits is None:
            sms = torch.cuda.get_device_properties(device).multi_processor_count
            splits = min(
                default_splits(num_kv_heads, self.group, head_dim, sms),
                MAX_CLUSTER,
                max(1, MAX_BLOCKS // num_kv_heads),
            )
        tpb, why = tiles_per_block(num_heads, num_kv_heads, head_dim, hidden, splits)
        if why:
            raise ValueError(f"fused attention + o_proj: {why}")
        self.splits, self.tiles_per_block = splits, tpb
        self.k = num_heads * head_dim
        self.shared = shared_bytes(head_dim, WARPS, splits) + -(-self.k * 2 // 16) * 16
        self.scale_log2 = math.log2(math.e) / math.sqrt(head_dim)
        from nib.engine.cuda.loader import Bound, module, pdl

        self._base = f"rope_attend_d{head_dim}_{DTYPES[dtype]}_w{WARPS}"
        blocks = splits * num_kv_heads
        fit = 0
        for m in MODES:
            kernel = module("attention.cu", device).kernel(self._base + MODES[m])
            if blocks > MAX_CLUSTER:
                kernel.allow_non_portable_cluster()
            fit = kernel.max_active_clusters(
                (splits, num_kv_heads), (WARPS * 32,), self.shared, (splits, num_kv_heads)
            )
        if fit < 1:
            raise ValueError(
                f"fused attention + o_proj: a cluster of {blocks} blocks with "
                f"{self.shared} bytes of shared memory each does not fit on this GPU"
            )
        self._module = Bound("attention.cu", device)
        self._pdl = pdl(device)

    def label(self) -> str:
        return (
            f"cuda fused rope+kv-write+split-K decode attention s{self.splits}w{WARPS} "
            f"+ int4 mma16 o_proj (cluster of {self.splits * self.num_kv_heads})"
        )

    def supports(self, packed: Any) -> str:
        """'' when `packed` (a layer's CudaInt4, or None) can run in this launch, else why not."""
        if packed is None:
            return "the o_proj is not nib's CUDA INT4 kernel"
        if packed.glu or packed.n != self.hidden or packed.k != self.k:
            return f"the o_proj is {packed.n}x{packed.k}, not {self.hidden}x{self.k}"
        if _index(packed.device) != _index(self.device):
            return "the o_proj is on another device"
        return ""

    def __call__(
        self,
        qkv: torch.Tensor,
        positions: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        packed: Any,
        residual: torch.Tensor,
    ) -> None:
        why = self.supports(packed)
        if why:
            raise ValueError(f"fused attention + o_proj: {why}")
        h, kvh, d, s = self.num_heads, self.num_kv_heads, self.head_dim, self.max_context
        if qkv.numel() != (h + 2 * kvh) * d or qkv.dtype != self.dtype or not qkv.is_contiguous():
            raise ValueError(
                f"fused attention + o_proj: qkv must be one contiguous {self.dtype} row of "
                f"{(h + 2 * kvh) * d}"
            )
        for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
            if tuple(c.shape) != (1, kvh, s, d) or c.dtype != self.dtype or not c.is_contiguous():
                raise ValueError(
                    f"fused attention + o_proj: {name} must be contiguous {(1, kvh, s, d)} "
                    f"{self.dtype}"
                )
        for name, tab in (("cos", cos), ("sin", sin)):
            if tab.shape[-1] != d or tab.shape[0] < s or not tab.is_contiguous():
                raise ValueError(
                    f"fused attention + o_proj: {name} must be contiguous [>= {s}, {d}]"
                )
        if positions.dtype != torch.int64 or positions.numel() < 1:
            raise ValueError("fused attention + o_proj: positions must be a device int64 tensor")
        if (
            residual.numel() != self.hidden
            or residual.dtype != self.dtype
            or not residual.is_contiguous()
        ):
            raise ValueError(
                f"fused attention + o_proj: residual must be one contiguous {self.dtype} row "
                f"of {self.hidden}"
            )
        bias = packed.bias
        if bias is not None and bias.dtype != self.dtype:
            raise ValueError("fused attention + o_proj: the o_proj bias is not in the model dtype")
        attn = RopeAttnArgs(
            qkv.data_ptr(), positions.data_ptr(), cos.data_ptr(), sin.data_ptr(),
            k_cache.data_ptr(), v_cache.data_ptr(), 0, 0, 0, 0, h, kvh, self.group, s,
            self.scale_log2,
        )  # fmt: skip
        args = OprojArgs(
            attn, packed.qw.data_ptr(), packed.sc.data_ptr(),
            0 if bias is None else bias.data_ptr(), residual.data_ptr(), self.tiles_per_block,
            order_warps(packed),
        )  # fmt: skip
        grid = (self.splits, kvh)
        self._module.get().kernel(self._base + MODES[self.mode]).launch(
            grid, (WARPS * 32,), args, self.shared, pdl=self._pdl, cluster=(self.splits, kvh, 1)
        )


def oproj_for_model(
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    hidden: int,
    max_context: int,
    dtype: torch.dtype,
    device: torch.device,
    o_projs: list[Any],
) -> tuple[FusedAttentionOproj | None, str]:
    """The fused kernel for this model where every layer's o_proj (`o_projs`: their
    CudaInt4 packings, None where a layer has none) can run in it, else (None, why not)."""
    if not o_projs or any(p is None for p in o_projs):
        return None, "the o_proj is not nib's CUDA INT4 kernel"
    from nib.engine.cuda import loader

    why = loader.unavailable_reason(device)
    if why:
        return None, f"cuda kernels unavailable: {why}"
    try:
        fused = FusedAttentionOproj(
            num_heads, num_kv_heads, head_dim, hidden, max_context, dtype, device
        )
    except Exception as exc:  # a shape it does not take, a cluster that does not fit
        return None, f"{type(exc).__name__}: {exc}"
    for p in o_projs:
        why = fused.supports(p)
        if why:
            return None, why
    return fused, ""
