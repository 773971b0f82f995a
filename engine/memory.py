"""CUDA memory health: the graph pool's size and the caching allocator's fragmentation.

Graph pool: every captured graph shares one private memory pool (graphs.py). Its
size is read once, after capture, from the allocator's own segment list
(`torch.cuda.memory_snapshot()`: the segments whose `segment_pool_id` is the pool's
id), so it counts exactly the memory the graphs hold: their intermediates (free
between replays but reserved for them) and their outputs. Replays allocate
nothing, so the number stays valid. Where a torch has no pool ids in its
snapshot (or whose ids do not match the graph's), the growth of reserved memory
across the capture is used instead (the engine thread is the only allocator
then); `method` says which.

Fragmentation: the share of reserved memory outside the graph pool that holds no
tensor, 1 - allocated / reserved over that memory. The pool is left out because
its free blocks are not waste: every replay reuses them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PoolUsage:
    reserved: int  # bytes of the segments the pool owns
    allocated: int  # bytes of live tensors in them
    method: str  # "snapshot" | "reserved-delta"


@dataclass(frozen=True)
class MemoryHealth:
    allocated: int
    reserved: int
    graph_pool: PoolUsage | None
    fragmentation: float | None  # None when nothing is reserved outside the pool


def graph_pool_usage(
    device: torch.device, pool: tuple[int, int] | None, reserved_delta: int
) -> PoolUsage | None:
    """The pool's bytes by the allocator's segment list (or the reserved-memory delta)."""
    if pool is None:
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    segments = torch.cuda.memory_snapshot()
    mine = [
        s
        for s in segments
        if tuple(s.get("segment_pool_id", ())) == tuple(pool) and s.get("device", index) == index
    ]
    if mine:
        return PoolUsage(
            sum(int(s["total_size"]) for s in mine),
            sum(int(s["allocated_size"]) for s in mine),
            "snapshot",
        )
    return PoolUsage(max(reserved_delta, 0), 0, "reserved-delta")


def fragmentation(allocated: int, reserved: int, pool: PoolUsage | None) -> float | None:
    """1 - allocated / reserved over the memory outside the graph pool."""
    outside_reserved = reserved - (pool.reserved if pool else 0)
    outside_allocated = allocated - (pool.allocated if pool else 0)
    if outside_reserved <= 0:
        return None
    return min(1.0, max(0.0, 1.0 - outside_allocated / outside_reserved))


def memory_health(device: torch.device, pool: PoolUsage | None) -> MemoryHealth:
    """Now, from the allocator's counters (cheap; safe from any thread)."""
    allocated = torch.cuda.memory_allocated(device)
    reserved = torch.cuda.memory_reserved(device)
    return MemoryHealth(allocated, reserved, pool, fragmentation(allocated, reserved, pool))
