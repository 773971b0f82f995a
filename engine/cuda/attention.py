"""One decode step's attention with RoPE and the KV-cache write fused in (attention.cu).

For T = 1 this replaces the Triton rope_cache kernel and the Triton split-K decode
attention with one launch: rotate q and k, write k and v into the static cache at
the device position, attend over the filled cache. `FusedDecodeAttention` holds the
split partials and counters for one model shape (one instance serves every layer:
launches on one stream run one after another) and checks its inputs at the door;
`for_model` builds it where the kernel applies and says why not elsewhere, so the
engine keeps the Triton pair as the fallback. `plan` is the kernel's split of the
sequence over blocks, and `reference` the fused op in PyTorch (tests, self-check).
"""

from __future__ import annotations

import ctypes
import math
import os
from dataclasses import dataclass
from typing import Any

import torch

HEAD_DIMS = (64, 128)
MAX_GROUP = 8  # query heads per KV head: the n8 side of the kernel's mma
TILE = 16  # positions per warp step (the mma's k16); chunks are multiples of it
WARPS = (4, 8)
MERGE_BYTES = 24 << 10  # what the last block of a KV head reads to merge the splits
MAX_SPLITS = 64
MAX_CONTEXT = 1 << 22  # the kernel's 32-bit byte offsets within one KV head's rows
DTYPES = {torch.bfloat16: "bf16", torch.float16: "f16"}


class RopeAttnArgs(ctypes.Structure):
    _fields_ = [
        ("qkv", ctypes.c_void_p), ("pos", ctypes.c_void_p), ("cos", ctypes.c_void_p),
        ("sin", ctypes.c_void_p), ("k_cache", ctypes.c_void_p), ("v_cache", ctypes.c_void_p),
        ("out", ctypes.c_void_p), ("o_part", ctypes.c_void_p), ("ml_part", ctypes.c_void_p),
        ("counters", ctypes.c_void_p), ("heads", ctypes.c_int), ("kv_heads", ctypes.c_int),
        ("group", ctypes.c_int), ("max_context", ctypes.c_int), ("scale_log2", ctypes.c_float),
    ]  # fmt: skip


def unsupported(num_heads: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> str:
    """'' when the kernel takes this shape, else the rule it breaks."""
    if head_dim not in HEAD_DIMS:
        return f"head_dim {head_dim} is not one of {HEAD_DIMS}"
    if num_kv_heads < 1 or num_heads % num_kv_heads:
        return f"{num_heads} heads do not split evenly over {num_kv_heads} KV heads"
    if num_heads // num_kv_heads > MAX_GROUP:
        return f"GQA group {num_heads // num_kv_heads} is above {MAX_GROUP} (the mma's n8)"
    if dtype not in DTYPES:
        return f"dtype {dtype} is not bf16 or fp16"
    return ""


def default_splits(num_kv_heads: int, group: int, head_dim: int, sms: int) -> int:
    """Blocks per KV head: at most one block per SM in all (an 8-warp block's shared
    memory leaves room for one per SM: a second wave would double the time), but few
    enough that the last block's merge reads at most MERGE_BYTES of partials
    (splits x G x D x 4 bytes)."""
    by_sms = max(1, sms // num_kv_heads)
    by_merge = max(1, MERGE_BYTES // (group * head_dim * 4))
    return max(1, min(by_sms, by_merge, MAX_SPLITS))


def plan(length: int, splits: int) -> tuple[int, int]:
    """(chunk, used): the positions per block and the blocks that have any, for a filled
    length; block b owns [b chunk, min((b + 1) chunk, length)). attention.cu computes
    the same from the device position."""
    per_block = -(-length // splits)
    chunk = -(-per_block // TILE) * TILE
    return chunk, -(-length // chunk)


@dataclass(frozen=True)
class LaunchShape:
    """What one instance launches: grid (splits, KV heads) of `warps` warps each."""

    splits: int
    warps: int
    cluster: bool = False  # the splits of a KV head merge in a thread-block cluster

    def label(self) -> str:
        return f"s{self.splits}w{self.warps}{'c' if self.cluster else ''}"


def shared_bytes(head_dim: int, warps: int, slots: int = 1) -> int:
    """attention.cu's dynamic shared memory: warps x stages x (K, V) tiles of 16 rows, the
    rotated queries [8][D], the new k and v rows, per-warp max and sum, a flag; then
    (16-byte aligned) `slots` merged partials, o [8][D] and (max, sum) [8][2] in fp32: a
    cluster launch's first block holds one a split, the global merge none (one is
    reserved all the same)."""
    row = head_dim * 2
    stages = 256 // head_dim
    base = warps * stages * 2 * TILE * row + 8 * row + 2 * row + 2 * warps * 8 * 4 + 16
    return -(-base // 16) * 16 + slots * (8 * head_dim * 4 + 8 * 2 * 4)


MAX_CLUSTER = 8  # the portable cluster size: the cluster merge takes at most 8 splits
CLUSTER_CAPABILITY = (9, 0)


def cluster_default(splits: int, device: torch.device) -> bool:
    """Whether the splits may merge through a thread-block cluster's distributed shared
    memory (sm_90, 2..MAX_CLUSTER splits; NIB_CUDA_CLUSTER=0 keeps the global merge).
    FusedDecodeAttention also asks the GPU whether every cluster fits at once."""
    if os.environ.get("NIB_CUDA_CLUSTER", "1") == "0":
        return False
    return 1 < splits <= MAX_CLUSTER and torch.cuda.get_device_capability(device) >= (
        CLUSTER_CAPABILITY
    )


def _clusters_fit(kernel: Any, splits: int, kv_heads: int, warps: int, shared: int) -> bool:
    """Whether all kv_heads clusters of `splits` blocks run on the GPU at once; False
    where the driver cannot say (the global merge then runs, not the Triton pair)."""
    from nib.engine.cuda.driver import CudaError

    try:
        fit = kernel.max_active_clusters((splits, kv_heads), (warps * 32,), shared, (splits,))
    except CudaError:
        return False
    return int(fit) >= kv_heads


class FusedDecodeAttention:
    """Preallocated partials and counters for one model shape; graph-safe (the position
    is read on the device, the grid is fixed). Call it as
    `fused(qkv [1, 1, (H + 2 KVH) D], positions [1] int64, cos [S, D], sin [S, D],
    k_cache [1, KVH, S, D], v_cache) -> out [1, H, 1, D]`; it writes rotated k and raw v
    at positions[0] and attends over [0, positions[0]]."""

    def __init__(
        self,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        max_context: int,
        dtype: torch.dtype,
        device: torch.device,
        *,
        splits: int | None = None,
        warps: int = 8,
        cluster: bool | None = None,
    ) -> None:
        why = unsupported(num_heads, num_kv_heads, head_dim, dtype)
        if why:
            raise ValueError(f"fused decode attention: {why}")
        if warps not in WARPS:
            raise ValueError(f"fused decode attention: warps {warps} is not one of {WARPS}")
        if not 1 <= max_context <= MAX_CONTEXT:
            raise ValueError(
                f"fused decode attention: max_context {max_context} not in 1..{MAX_CONTEXT}"
            )
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.group = num_heads // num_kv_heads
        self.max_context = max_context
        self.dtype, self.device = dtype, device
        if splits is None:
            sms = torch.cuda.get_device_properties(device).multi_processor_count
            splits = default_splits(num_kv_heads, self.group, head_dim, sms)
        if not 1 <= splits <= MAX_SPLITS:
            raise ValueError(f"fused decode attention: splits {splits} not in 1..{MAX_SPLITS}")
        from nib.engine.cuda.loader import Bound, module, pdl

        base = f"rope_attend_d{head_dim}_{DTYPES[dtype]}_w{warps}"
        if cluster is None:
            # Measured on the H200 (bench/results/2026-12-01-micro-attention.json): the
            # cluster merge saves ~0.6 us a layer where the clusters all run at once
            # (Qwen2.5-1.5B: 2 KV heads x 8 splits), and costs a second wave where they
            # do not (Llama-2-7B: 32 x 4 whole-SM blocks, 6.4 -> 8.9 us).
            cluster = cluster_default(splits, device) and _clusters_fit(
                module("attention.cu", device).kernel(base + "_cluster"),
                splits,
                num_kv_heads,
                warps,
                shared_bytes(head_dim, warps, splits),
            )
        if cluster and torch.cuda.get_device_capability(device) < CLUSTER_CAPABILITY:
            raise ValueError("fused decode attention: a cluster merge needs sm_90 or newer")
        if cluster and not 1 <= splits <= MAX_CLUSTER:
            raise ValueError(
                f"fused decode attention: a cluster merge takes 1..{MAX_CLUSTER} splits, "
                f"not {splits}"
            )
        self.shape = LaunchShape(splits, warps, cluster)
        self.shared = shared_bytes(head_dim, warps, splits if cluster else 1)
        rows = num_kv_heads * splits * self.group
        self.o_part = torch.empty((rows, head_dim), dtype=torch.float32, device=device)
        self.ml_part = torch.empty((rows, 2), dtype=torch.float32, device=device)
        # Zero between launches: the merging block resets its counter.
        self.counters = torch.zeros(num_kv_heads, dtype=torch.int32, device=device)
        self.scale_log2 = math.log2(math.e) / math.sqrt(head_dim)
        self._module = Bound("attention.cu", device)
        self._kernel_name = base + ("_cluster" if cluster else "")
        self._pdl = pdl(device)  # starts while the q/k/v GEMV finishes (attention.cu)

    def label(self) -> str:
        return f"cuda fused rope+kv-write+split-K decode attention {self.shape.label()}"

    def _check(
        self,
        qkv: torch.Tensor,
        positions: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
    ) -> None:
        h, kvh, d, s = self.num_heads, self.num_kv_heads, self.head_dim, self.max_context
        width = (h + 2 * kvh) * d
        if qkv.numel() != width or qkv.dtype != self.dtype or not qkv.is_contiguous():
            raise ValueError(
                f"fused decode attention: qkv must be one contiguous {self.dtype} row of "
                f"{width}, got {tuple(qkv.shape)} {qkv.dtype}"
            )
        cache = (1, kvh, s, d)
        for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
            if tuple(c.shape) != cache or c.dtype != self.dtype or not c.is_contiguous():
                raise ValueError(
                    f"fused decode attention: {name} must be contiguous {cache} {self.dtype}"
                )
        for name, tab in (("cos", cos), ("sin", sin)):
            if tab.dim() != 2 or tab.shape[1] != d or tab.shape[0] < s or tab.dtype != self.dtype:
                raise ValueError(f"fused decode attention: {name} must be [>= {s}, {d}]")
            if not tab.is_contiguous():
                raise ValueError(f"fused decode attention: {name} must be contiguous")
        if positions.dtype != torch.int64 or positions.numel() < 1:
            raise ValueError("fused decode attention: positions must be a device int64 tensor")
        for t in (qkv, cos, sin, k_cache, v_cache):
            if t.device != positions.device or t.data_ptr() % 16:
                raise ValueError(
                    "fused decode attention: tensors must share one device, 16-byte aligned"
                )

    def __call__(
        self,
        qkv: torch.Tensor,
        positions: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        self._check(qkv, positions, cos, sin, k_cache, v_cache)
        if out is None:
            out = torch.empty(
                (1, self.num_heads, 1, self.head_dim), dtype=self.dtype, device=qkv.device
            )
        elif out.numel() != self.num_heads * self.head_dim or not out.is_contiguous():
            raise ValueError("fused decode attention: out must be contiguous [1, H, 1, D]")
        args = RopeAttnArgs(
            qkv.data_ptr(), positions.data_ptr(), cos.data_ptr(), sin.data_ptr(),
            k_cache.data_ptr(), v_cache.data_ptr(), out.data_ptr(), self.o_part.data_ptr(),
            self.ml_part.data_ptr(), self.counters.data_ptr(), self.num_heads,
            self.num_kv_heads, self.group, self.max_context, self.scale_log2,
        )  # fmt: skip
        grid = (self.shape.splits, self.num_kv_heads)
        cluster = (self.shape.splits, 1, 1) if self.shape.cluster else None
        self._module.get().kernel(self._kernel_name).launch(
            grid, (self.shape.warps * 32,), args, self.shared, pdl=self._pdl, cluster=cluster
        )
        return out


def for_model(
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    max_context: int,
    dtype: torch.dtype,
    device: torch.device,
) -> tuple[FusedDecodeAttention | None, str]:
    """The fused kernel for this model, or (None, why not): an unsupported shape, or no
    CUDA kernels on this device (no nvcc, an old GPU, NIB_CUDA_KERNELS=0)."""
    why = unsupported(num_heads, num_kv_heads, head_dim, dtype)
    if why:
        return None, why
    from nib.engine.cuda import loader

    why = loader.unavailable_reason(device)
    if why:
        return None, f"cuda kernels unavailable: {why}"
    try:
        return FusedDecodeAttention(
            num_heads, num_kv_heads, head_dim, max_context, dtype, device
        ), ""
    except Exception as exc:  # a load failure keeps the Triton pair serving
        return None, f"{type(exc).__name__}: {exc}"


def reference(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    *,
    rounded: bool = True,
) -> torch.Tensor:
    """The fused op in PyTorch: RoPE rounded as the kernels round it (each product and the
    sum in the activation dtype), k and v written at positions[0], then attention over
    [0, positions[0]] in float64 -> [1, H, 1, D] in the activation dtype (float64 with
    rounded=False)."""
    d = k_cache.shape[-1]
    p = int(positions.reshape(-1)[0])
    q, k, v = qkv.reshape(-1).split([num_heads * d, num_kv_heads * d, num_kv_heads * d])
    c, s = cos[p], sin[p]

    def rotate(x: torch.Tensor) -> torch.Tensor:
        half = d // 2
        partner = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return (x.float() * c.float()).to(x.dtype) + (partner.float() * s.float()).to(x.dtype)

    k_cache[0, :, p] = rotate(k.view(num_kv_heads, d))
    v_cache[0, :, p] = v.view(num_kv_heads, d)
    qr = rotate(q.view(num_heads, d)).double()
    group = num_heads // num_kv_heads
    keys = k_cache[0, :, : p + 1].double().repeat_interleave(group, dim=0)  # [H, L, D]
    values = v_cache[0, :, : p + 1].double().repeat_interleave(group, dim=0)
    scores = torch.einsum("hd,hld->hl", qr, keys) / math.sqrt(d)
    out = torch.einsum("hl,hld->hd", scores.softmax(-1), values).view(1, num_heads, 1, d)
    return out.to(qkv.dtype) if rounded else out
