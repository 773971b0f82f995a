"""The decode step's embedding lookup in a kernel that lets the next one start (embed.cu).

PyTorch's embedding kernel was the decode graph's first node: it does not launch
the next kernel early, so the first layer's q/k/v GEMV began streaming its weights
only after it. `CudaEmbedding` copies row tokens[r] of the table for each row with
programmatic dependent launch; the GEMV behind it launches at once and waits for
the rows before it reads them. A token outside the vocabulary gives a zero row
(the engine never feeds one) instead of a device assert.
"""

from __future__ import annotations

import ctypes
import logging

import torch

from nib.engine.cuda import build, driver

log = logging.getLogger("nib.engine")

THREADS = 256  # embed.cu's THREADS
VECTORS_PER_BLOCK = THREADS  # one 16-byte vector per thread and block
MAX_ROWS = 65535  # the grid's y dimension
LABEL = "cuda embed_rows (launches the next kernel early)"


class EmbedArgs(ctypes.Structure):
    _fields_ = [
        ("tokens", ctypes.c_void_p), ("table", ctypes.c_void_p), ("out", ctypes.c_void_p),
        ("vocab", ctypes.c_longlong), ("rows", ctypes.c_int), ("vecs", ctypes.c_int),
    ]  # fmt: skip


def check_table(table: torch.Tensor) -> None:
    """What the kernel needs of the table, named in the error."""
    if table.dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"embed: the table must be fp16 or bf16, got {table.dtype}")
    if table.dim() != 2 or not table.is_contiguous():
        raise ValueError(f"embed: the table must be a contiguous [vocab, hidden] tensor, got {tuple(table.shape)}")  # fmt: skip
    if (table.shape[1] * table.element_size()) % 16 or table.data_ptr() % 16:
        raise ValueError(
            f"embed: a row must be whole 16-byte vectors on a 16-byte boundary (hidden "
            f"{table.shape[1]} x {table.element_size()} bytes)"
        )


def check_tokens(tokens: torch.Tensor, device: torch.device) -> None:
    if tokens.dtype != torch.int64 or not tokens.is_contiguous() or tokens.device != device:
        raise ValueError(
            f"embed: tokens must be a contiguous int64 tensor on {device}, got {tokens.dtype} "
            f"on {tokens.device}"
        )
    if not 1 <= tokens.numel() <= MAX_ROWS:
        raise ValueError(f"embed: tokens must hold 1 to {MAX_ROWS} tokens, got {tokens.numel()}")


def blocks_for(hidden: int, element_size: int) -> int:
    """Blocks per row: one 16-byte vector per thread."""
    vecs = hidden * element_size // 16
    return max(1, -(-vecs // VECTORS_PER_BLOCK))


class CudaEmbedding:
    """Rows of one embedding table, looked up on the current stream (graph-safe)."""

    def __init__(self, table: torch.Tensor) -> None:
        from nib.engine.cuda.loader import Bound, pdl

        check_table(table)
        self.table, self.device = table, table.device  # a tensor's device has its index
        self._vecs = table.shape[1] * table.element_size() // 16
        self._blocks = blocks_for(table.shape[1], table.element_size())
        self._module = Bound("embed.cu", self.device)
        self._pdl = pdl(self.device)

    @property
    def label(self) -> str:
        return LABEL

    def __call__(self, tokens: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """tokens [..., T] int64 on the table's device -> [..., T, hidden] in its dtype
        (into `out` when given: contiguous, that shape and dtype)."""
        check_tokens(tokens, self.device)
        vocab, hidden = self.table.shape
        shape = (*tokens.shape, hidden)
        if out is None:
            out = torch.empty(shape, dtype=self.table.dtype, device=self.device)
        elif (
            out.shape != shape
            or out.dtype != self.table.dtype
            or not out.is_contiguous()
            or out.device != self.device
        ):
            raise ValueError(
                f"embed: out must be a contiguous {self.table.dtype} tensor of shape {shape} "
                f"on {self.device}, got {out.dtype} {tuple(out.shape)}"
            )
        rows = tokens.numel()
        args = EmbedArgs(
            tokens.data_ptr(), self.table.data_ptr(), out.data_ptr(), vocab, rows, self._vecs
        )
        self._module.get().kernel("embed_rows").launch(
            (self._blocks, rows), (THREADS,), args, pdl=self._pdl
        )
        return out


def cuda_embedding(table: torch.Tensor) -> CudaEmbedding | None:
    """The kernel for this table, or None where nib's CUDA kernels are unavailable or the
    table does not suit it (the caller keeps PyTorch's embedding)."""
    from nib.engine.cuda.loader import available

    if table.device.type != "cuda" or not available(table.device):
        return None
    try:
        return CudaEmbedding(table)
    except ValueError as exc:
        log.info("embed: PyTorch embedding (%s)", exc)
        return None
    except (build.CudaBuildError, driver.CudaError, OSError) as exc:
        log.warning("embed: CUDA kernel unavailable (%s); using PyTorch's embedding", exc)
        return None
