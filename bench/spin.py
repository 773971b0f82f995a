"""Keep CPUs from idling while a measurement runs: busy processes at the lowest priority.

    with spinners(8):
        ...  # every hand-off between threads or processes in here finds its CPU awake

On a virtual machine an idle vCPU halts, and waking a thread on it costs a trip through
the hypervisor; a loop at SCHED_IDLE (nice 19 where that policy is missing) keeps the
vCPU running and gives way to any other thread at once. Used by bench/wake_latency.py,
bench/wire_trace.py and bench/wire.py (`--spin N`) to measure what those wake-ups cost.
The spinners end with the `with`, and by themselves if this process dies.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator

# The spinner: lowest priority, then spin until its parent is gone.
_SPINNER = """
import os, sys
parent = int(sys.argv[1])
try:
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
except (AttributeError, OSError):
    os.nice(19)
while os.getppid() == parent:
    for _ in range(200_000):
        pass
"""


def spin_policy() -> str:
    """The scheduling policy a spinner gets on this machine."""
    return "SCHED_IDLE" if hasattr(os, "SCHED_IDLE") else "nice 19"


@contextlib.contextmanager
def spinners(count: int) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Run `count` spinner processes for the duration of the block (0: none)."""
    if count < 0:
        raise ValueError(f"spinner count must be at least 0, got {count}")
    procs = [
        subprocess.Popen([sys.executable, "-c", _SPINNER, str(os.getpid())]) for _ in range(count)
    ]
    try:
        yield procs
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
