"""A greedy step's end in one kernel (greedy.cu): each row's argmax and log-probability,
stored where the host reads them.

After the lm_head, the PyTorch sequence (a fp32 copy, argmax, two reductions for
the logsumexp, gather, elementwise kernels, a device copy of the token and two
copies into pinned memory) costs ~35-40 us per token on the H200, for a row of
64-300 KB that sits in L2. `CudaGreedy` holds the kernel's workspace and
counters for one vocabulary and up to `max_rows` rows and launches it on the
current stream; the counters reset themselves, so it replays inside a CUDA
graph. Outputs are device tensors or pinned host tensors: a pinned one is
stored by the kernel itself at its mapped device address
(driver.host_device_pointer), which takes the memcpy nodes out of the graph;
where the driver does not map it, the kernel writes a device buffer and a
non-blocking copy follows, as before.
"""

from __future__ import annotations

import ctypes
import logging

import torch

from nib.engine.cuda import build, driver
from nib.engine.cuda.w4a16 import PickPtrs

log = logging.getLogger("nib.engine")

THREADS = 256  # greedy.cu's THREADS
VECTORS_PER_THREAD = 2  # greedy.cu's VPT: 16-byte loads in flight per thread
MAX_BLOCKS = 128  # per row; past this the threads loop
PARTIAL_FLOATS = 8  # one block's partial in the workspace
PICK_GROUP = 64  # w4a16.cu's PICK_GROUP: the fused pick merges per group of blocks first
KERNELS = {torch.float32: "greedy_f32", torch.float16: "greedy_f16", torch.bfloat16: "greedy_bf16"}
LABEL = "cuda greedy argmax+logprob"


class GreedyArgs(ctypes.Structure):
    _fields_ = [
        ("logits", ctypes.c_void_p), ("bias", ctypes.c_void_p), ("ws", ctypes.c_void_p),
        ("counters", ctypes.c_void_p), ("token", ctypes.c_void_p),
        ("out_token", ctypes.c_void_p), ("out_logprob", ctypes.c_void_p),
        ("advance", ctypes.c_void_p), ("row_stride", ctypes.c_longlong), ("vocab", ctypes.c_int), ("sys_fence", ctypes.c_int),
    ]  # fmt: skip


def blocks_for(vocab: int, dtype: torch.dtype) -> int:
    """Blocks per row: one trip of VECTORS_PER_THREAD 16-byte loads per thread covers the
    row (every load in flight at once), at most MAX_BLOCKS."""
    per_vector = 16 // torch.empty((), dtype=dtype).element_size()
    vectors = vocab // per_vector
    return max(1, min(MAX_BLOCKS, -(-vectors // (THREADS * VECTORS_PER_THREAD))))


def _check_out(
    name: str, t: torch.Tensor, dtype: torch.dtype, rows: int, device: torch.device
) -> None:
    if t.dtype != dtype or t.numel() != rows or not t.is_contiguous():
        raise ValueError(
            f"greedy: {name} must be a contiguous {dtype} tensor of {rows} elements (one per "
            f"row), got {t.dtype} {tuple(t.shape)}"
        )
    if t.device != device and t.device.type != "cpu":
        raise ValueError(f"greedy: {name} must be on {device} or in pinned host memory")


def check_call(
    vocab: int,
    max_rows: int,
    device: torch.device,
    logits: torch.Tensor,
    bias: torch.Tensor | None,
    token: torch.Tensor | None,
    out_token: torch.Tensor,
    out_logprob: torch.Tensor,
    advance: torch.Tensor | None = None,
) -> None:
    """The kernel's rules, named in the error (logits already 2-D)."""
    if logits.dtype not in KERNELS:
        raise ValueError(f"greedy: logits must be fp32, fp16 or bf16, got {logits.dtype}")
    if logits.dim() != 2 or logits.shape[1] != vocab or not 1 <= logits.shape[0] <= max_rows:
        raise ValueError(
            f"greedy: logits must be [1..{max_rows}, {vocab}], got {tuple(logits.shape)}"
        )
    if logits.device != device or (vocab > 1 and logits.stride(1) != 1):
        raise ValueError(f"greedy: logits must be on {device} with unit stride along the vocab")
    rows = logits.shape[0]
    if bias is not None and (
        bias.dtype != torch.float32
        or bias.shape != (vocab,)
        or not bias.is_contiguous()
        or bias.device != device
    ):
        raise ValueError(f"greedy: bias must be a contiguous fp32 [{vocab}] tensor on {device}")
    check_outputs(rows, device, token, out_token, out_logprob, advance)


def check_outputs(
    rows: int,
    device: torch.device,
    token: torch.Tensor | None,
    out_token: torch.Tensor,
    out_logprob: torch.Tensor,
    advance: torch.Tensor | None,
) -> None:
    """Where a pick's results go, for `rows` rows (the kernel's and the fused pick's rules)."""
    if token is not None:
        _check_out("token", token, torch.int64, rows, device)
        if token.device != device:
            raise ValueError(f"greedy: token must be on {device}")
    _check_out("out_token", out_token, torch.int64, rows, device)
    _check_out("out_logprob", out_logprob, torch.float32, rows, device)
    if advance is not None:
        _check_out("advance", advance, torch.int64, 1, device)
        if advance.device != device:
            raise ValueError(f"greedy: advance must be on {device}")


class CudaGreedy:
    """Argmax + log-probability of up to `max_rows` rows of `vocab` logits, one launch.

    sys_fence: the kernel fences its stores at system scope before it ends (see the
    comment at the end of greedy.cu); the event the host waits on already orders them."""

    def __init__(
        self, vocab: int, max_rows: int, device: torch.device, sys_fence: bool = True
    ) -> None:
        if vocab < 1 or max_rows < 1:
            raise ValueError(f"greedy: vocab {vocab} and max_rows {max_rows} must be >= 1")
        from nib.engine.cuda.loader import Bound, pdl

        if device.type == "cuda" and device.index is None:  # "cuda" != "cuda:0" in checks
            device = torch.device("cuda", torch.cuda.current_device())
        self.vocab, self.max_rows, self.device = vocab, max_rows, device
        self.sys_fence = sys_fence
        self._module = Bound("greedy.cu", device)
        # Programmatic dependent launch (sm_90): start while the lm_head finishes.
        self._pdl = pdl(device)
        self.ws = torch.empty(max_rows * MAX_BLOCKS * PARTIAL_FLOATS, device=device)
        self.counters = torch.zeros(max_rows, dtype=torch.int32, device=device)
        # Where the kernel writes an output the driver could not map (then copied).
        self._token = torch.empty(max_rows, dtype=torch.int64, device=device)
        self._logprob = torch.empty(max_rows, device=device)
        # Pinned storage -> its device address. Resolved on first use, which the graph
        # runner's warm-up makes happen before capture: no driver query inside a capture.
        # PyTorch's pinned allocator keeps a block (and so its mapping) while it caches it.
        self._mapped: dict[int, int] = {}
        self.maps_host = True  # False once the driver refused to map a pinned output

    @property
    def label(self) -> str:
        return LABEL if self.maps_host else f"{LABEL} (copies to host: unmapped pinned memory)"

    def address(self, t: torch.Tensor) -> int | None:
        """Where the kernel stores `t`'s first element, or None when it cannot."""
        if t.device.type != "cpu":
            return int(t.data_ptr())
        storage = int(t.untyped_storage().data_ptr())
        base = self._mapped.get(storage)
        if base is None:
            if not t.is_pinned():
                raise ValueError("greedy: a host output must be in pinned memory")
            try:
                base = driver.host_device_pointer(storage, self.device)
            except driver.CudaError as exc:
                if self.maps_host:
                    log.warning("greedy: pinned outputs not mapped (%s); copying instead", exc)
                self.maps_host = False
                return None
            self._mapped[storage] = base
        return base + (int(t.data_ptr()) - storage)

    def run(
        self,
        logits: torch.Tensor,
        out_token: torch.Tensor,
        out_logprob: torch.Tensor,
        bias: torch.Tensor | None = None,
        token: torch.Tensor | None = None,
        advance: torch.Tensor | None = None,
    ) -> None:
        """For each row r of logits [rows, V] (or one row [V]; fp32/fp16/bf16, unit stride
        along V): out_token[r] = argmax(logits[r] + bias) (int64, first index on ties, as
        torch.argmax), out_logprob[r] = logits[r][token] - logsumexp(logits[r]) (fp32, of
        the row without bias) and token[r] = the same token (optional, on the device).
        out_token / out_logprob are device tensors or pinned host tensors; the host reads
        pinned ones after an event recorded behind this call. advance (optional, one
        int64 on the device: the decode position) gets 1 added once the tokens are out,
        so that no kernel of its own sits between the lm_head and this one."""
        rows2 = logits.view(1, -1) if logits.dim() == 1 else logits
        check_call(
            self.vocab, self.max_rows, self.device, rows2, bias, token, out_token, out_logprob,
            advance,
        )  # fmt: skip
        rows = int(rows2.shape[0])
        tok_addr = self.address(out_token)
        lp_addr = self.address(out_logprob)
        name = KERNELS[rows2.dtype] + ("_bias" if bias is not None else "")
        args = GreedyArgs(
            rows2.data_ptr(), driver.ptr(bias), self.ws.data_ptr(), self.counters.data_ptr(),
            driver.ptr(token),
            self._token.data_ptr() if tok_addr is None else tok_addr,
            self._logprob.data_ptr() if lp_addr is None else lp_addr,
            driver.ptr(advance), rows2.stride(0), self.vocab, int(self.sys_fence),
        )  # fmt: skip
        blocks = blocks_for(self.vocab, rows2.dtype)
        self._module.get().kernel(name).launch((blocks, rows), (THREADS,), args, pdl=self._pdl)
        if tok_addr is None:
            out_token.copy_(self._token[:rows], non_blocking=True)
        if lp_addr is None:
            out_logprob.copy_(self._logprob[:rows], non_blocking=True)


class FusedPick:
    """The greedy pick fused into a one-row lm_head's epilogue (w4a16.cu with pick.cuh):
    the lm_head's blocks merge their logits' argmax and logsumexp through this
    workspace and the last of them writes the token, its log-probability and the
    advanced position, as CudaGreedy.run does, one kernel boundary fewer a step.

    `parts`: the most blocks of tiles the lm_head may launch (its tile count). The
    counter resets itself, so the launch replays inside a CUDA graph."""

    def __init__(self, greedy: CudaGreedy, parts: int) -> None:
        if parts < 1:
            raise ValueError(f"greedy: a fused pick needs at least one part, got {parts}")
        self.greedy, self.parts = greedy, parts
        device = greedy.device
        groups = -(-parts // PICK_GROUP) if parts > PICK_GROUP else 0
        # Each block's partial, then each group's (pick.cuh's two-level merge); the
        # final ticket, then one per group.
        self.ws = torch.empty((parts + groups) * PARTIAL_FLOATS, device=device)
        self.counter = torch.zeros(1 + groups, dtype=torch.int32, device=device)

    def pointers(
        self,
        out_token: torch.Tensor,
        out_logprob: torch.Tensor,
        token: torch.Tensor | None = None,
        advance: torch.Tensor | None = None,
    ) -> PickPtrs | None:
        """The kernel's view of one pick's outputs (one row; rules as CudaGreedy.run's), or
        None where a pinned output is not mapped for the device (then the lm_head and
        CudaGreedy.run, which copies, stay separate)."""
        g = self.greedy
        check_outputs(1, g.device, token, out_token, out_logprob, advance)
        tok_addr, lp_addr = g.address(out_token), g.address(out_logprob)
        if tok_addr is None or lp_addr is None:
            return None
        return PickPtrs(
            self.ws.data_ptr(), self.counter.data_ptr(), driver.ptr(token), tok_addr,
            lp_addr, driver.ptr(advance), int(g.sys_fence), self.parts,
        )  # fmt: skip


def cuda_greedy(vocab: int, max_rows: int, device: torch.device) -> CudaGreedy | None:
    """The kernel for this device, or None where nib's CUDA kernels are unavailable (the
    caller keeps the PyTorch sequence)."""
    from nib.engine.cuda.loader import available

    if device.type != "cuda" or not available(device):
        return None
    try:
        return CudaGreedy(vocab, max_rows, device)
    except (build.CudaBuildError, driver.CudaError, OSError) as exc:  # keep PyTorch's path
        log.warning("greedy: CUDA kernel unavailable (%s); using torch argmax", exc)
        return None
