"""What one wake-up costs on this machine: ping-pong round trips, with and without spinners.

    python3 bench/wake_latency.py                      # spinners on every CPU, interleaved
    python3 bench/wake_latency.py --spin 0,4 --rounds 4

A served token crosses several threads and processes (the engine thread, the event
loop, gRPC's threads in the server and the client); each crossing wakes a thread that
was asleep. This measures that cost alone: one byte back and forth between two
processes over a pipe and over loopback TCP (TCP_NODELAY, as gRPC sets it), left where
the scheduler puts them and pinned to two different CPUs (`-xcpu`), and between two
threads of one process over pipes (the woken thread must also take the GIL). Each
transport runs with no spinners and with `--spin` ones (bench/spin.py: busy processes at
SCHED_IDLE that keep the CPUs from idling and give way at once), in rounds that
alternate, so both see the same machine. Writes <out>/<date>-wake-latency.json.
"""

from __future__ import annotations

import argparse
import os
import platform
import socket
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import cpu_name, percentile, write_result
from spin import spin_policy, spinners

ROOT = Path(__file__).resolve().parent.parent
TRANSPORTS = ("pipe", "tcp", "thread", "pipe-xcpu", "tcp-xcpu")


def _echo_fd(rfd: int, wfd: int) -> None:
    """Answer every byte read from rfd with one on wfd, until rfd closes."""
    while os.read(rfd, 1):
        os.write(wfd, b"x")


def _times(
    send: Callable[[], None], recv: Callable[[], None], iters: int, idle_s: float
) -> list[float]:
    """Round trips in microseconds, after a warm-up; idle_s: both sides wait that long
    (asleep) before each one, as between a request and the token that answers it."""
    for _ in range(min(200, iters)):
        send()
        recv()
    out = []
    for _ in range(iters):
        if idle_s:
            time.sleep(idle_s)
        t0 = time.perf_counter_ns()
        send()
        recv()
        out.append((time.perf_counter_ns() - t0) / 1e3)
    return out


def _pin(cpu: int | None) -> None:
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})


def ping_pipe(iters: int, idle_s: float, cpus: tuple[int, int] | None = None) -> list[float]:
    child_r, parent_w = os.pipe()  # parent -> child
    parent_r, child_w = os.pipe()  # child -> parent
    pid = os.fork()
    if pid == 0:  # the child echoes, then leaves without running the parent's cleanup
        _pin(cpus and cpus[1])
        os.close(parent_w)
        os.close(parent_r)
        try:
            _echo_fd(child_r, child_w)
        finally:
            os._exit(0)
    os.close(child_r)
    os.close(child_w)
    before = _pinned(cpus)
    try:
        return _times(lambda: os.write(parent_w, b"x"), lambda: _read1(parent_r), iters, idle_s)
    finally:
        os.close(parent_w)
        os.close(parent_r)
        os.waitpid(pid, 0)
        os.sched_setaffinity(0, before)


def _read1(fd: int) -> None:
    if not os.read(fd, 1):
        raise RuntimeError("the echo side closed its end")


def _pinned(cpus: tuple[int, int] | None) -> set[int]:
    """Pin this process to cpus[0] (when given); returns the affinity to restore."""
    before = os.sched_getaffinity(0)
    _pin(cpus and cpus[0])
    return before


def ping_tcp(iters: int, idle_s: float, cpus: tuple[int, int] | None = None) -> list[float]:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    pid = os.fork()
    if pid == 0:
        _pin(cpus and cpus[1])
        try:
            conn, _ = listener.accept()
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while conn.recv(1):
                conn.sendall(b"x")
        finally:
            os._exit(0)
    listener.close()
    before = _pinned(cpus)
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def recv() -> None:
        if not sock.recv(1):
            raise RuntimeError("the echo side closed the connection")

    try:
        return _times(lambda: sock.sendall(b"x"), recv, iters, idle_s)
    finally:
        sock.close()
        os.waitpid(pid, 0)
        os.sched_setaffinity(0, before)


def ping_thread(iters: int, idle_s: float) -> list[float]:
    echo_r, main_w = os.pipe()  # main -> echo thread
    main_r, echo_w = os.pipe()  # echo thread -> main
    echo = threading.Thread(target=_echo_fd, args=(echo_r, echo_w), daemon=True)
    echo.start()
    try:
        return _times(lambda: os.write(main_w, b"x"), lambda: _read1(main_r), iters, idle_s)
    finally:
        os.close(main_w)  # the echo thread reads the end and returns
        echo.join(5)
        for fd in (echo_r, main_r, echo_w):
            os.close(fd)


def _two_cpus() -> tuple[int, int]:
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("the -xcpu transports need two CPUs this process may run on")
    return cpus[0], cpus[-1]


# "-xcpu": the two sides pinned to two different CPUs, as an event loop and a client
# that the scheduler spreads over the machine are.
PINGS: dict[str, Callable[[int, float], list[float]]] = {
    "pipe": ping_pipe,
    "tcp": ping_tcp,
    "thread": ping_thread,
    "pipe-xcpu": lambda n, idle: ping_pipe(n, idle, _two_cpus()),
    "tcp-xcpu": lambda n, idle: ping_tcp(n, idle, _two_cpus()),
}


def host_facts() -> dict[str, object]:
    """What decides wake-up cost besides the CPU (the result's `device`): the idle
    driver and its states, virtualisation."""
    facts: dict[str, object] = {
        "platform": platform.platform(),
        "spin_policy": spin_policy(),
    }
    cpuidle = Path("/sys/devices/system/cpu/cpuidle")
    for name in ("current_driver", "current_governor", "current_governor_ro"):
        path = cpuidle / name
        if path.exists():
            facts[f"cpuidle_{name}"] = path.read_text().strip()
    states = sorted(Path("/sys/devices/system/cpu/cpu0/cpuidle").glob("state*"))
    facts["cpu0_idle_states"] = [
        {
            "name": (s / "name").read_text().strip(),
            "exit_latency_us": int((s / "latency").read_text()),
        }
        for s in states
        if (s / "name").exists() and (s / "latency").exists()
    ]
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        facts["hypervisor"] = " hypervisor " in cpuinfo.read_text().replace("\n", " ")
    return facts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--spin",
        default=f"0,{os.cpu_count() or 1}",
        help="comma-separated spinner counts to compare (default: none, and one per CPU)",
    )
    p.add_argument("--iters", type=int, default=3000, help="round trips per measurement")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument(
        "--idle-ms",
        default="0,2",
        help="comma-separated sleeps before each round trip (default: none, and 2 ms: "
        "a CPU that idled between a request and its answer)",
    )
    p.add_argument("--transport", action="append", choices=TRANSPORTS, help="default: all")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = p.parse_args(argv)
    try:
        counts = [int(c) for c in args.spin.split(",")]
        idles = [float(i) for i in args.idle_ms.split(",")]
    except ValueError:
        p.error(f"--spin takes integers, --idle-ms numbers: {args.spin!r}, {args.idle_ms!r}")
    if any(c < 0 for c in counts) or any(i < 0 for i in idles):
        p.error("--spin counts and --idle-ms values must be >= 0")
    if args.iters < 1 or args.rounds < 1:
        p.error("--iters and --rounds must be at least 1")
    transports = args.transport or list(TRANSPORTS)
    rows = []
    for rnd in range(args.rounds):
        for count in counts if rnd % 2 == 0 else counts[::-1]:
            with spinners(count):
                time.sleep(0.2)  # let the spinners reach their loops
                for transport in transports:
                    for idle_ms in idles:
                        # Idle round trips take idle_ms each: fewer of them, same time.
                        iters = args.iters if not idle_ms else max(50, args.iters // 10)
                        us = sorted(PINGS[transport](iters, idle_ms / 1e3))
                        row = {
                            "transport": transport,
                            "spin": count,
                            "idle_ms": idle_ms,
                            "round": rnd,
                            "iters": iters,
                            "median_us": round(statistics.median(us), 2),
                            "p90_us": round(percentile(us, 0.9), 2),
                            "p99_us": round(percentile(us, 0.99), 2),
                        }
                        rows.append(row)
                        print(
                            f"round {rnd} spin {count:>3} idle {idle_ms:g} ms {transport:>9}: "
                            f"median {row['median_us']:8.1f} us, p90 {row['p90_us']:8.1f}, "
                            f"p99 {row['p99_us']:8.1f}",
                            flush=True,
                        )
    summary = {
        f"{t}_spin{c}_idle{i:g}_median_us": round(
            statistics.median(
                r["median_us"]
                for r in rows
                if r["transport"] == t and r["spin"] == c and r["idle_ms"] == i
            ),
            2,
        )
        for t in transports
        for c in counts
        for i in idles
    }
    for key, value in summary.items():
        print(f"  {key:>36} {value:9.1f}")
    fields = {"host": host_facts(), "summary": summary, "rows": rows}
    write_result(args.out, "wake-latency", "wake_latency.py", fields, device=cpu_name())
    return 0


if __name__ == "__main__":
    sys.exit(main())
