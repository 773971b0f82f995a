"""Start and stop a `nib serve` process on loopback for bench scripts, and read its
resident memory and thread count from /proc."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class ServerProcess:
    process: subprocess.Popen[bytes]
    address: str
    metrics_url: str
    log: Path

    def proc_stats(self) -> dict[str, float]:
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        return {
            "rss_mb": round(int(fields["VmRSS"].split()[0]) / 1024, 1),
            "threads": int(fields["Threads"]),
        }

    def thread_names(self) -> list[str]:
        tasks = Path(f"/proc/{self.process.pid}/task")
        return sorted((t / "comm").read_text().strip() for t in tasks.iterdir())

    def stop(self) -> int | None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                return self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
        return self.process.wait()


def start_server(workdir: Path, model: Path | None, max_queue: int) -> ServerProcess:
    if model is None:
        from nib.engine.default_model import make_random_model

        model = make_random_model(workdir / "model")
    port, metrics_port = free_port(), free_port()
    log = workdir / "server.log"
    cmd = [
        sys.executable,
        "-m",
        "nib.sdk.cli",
        "serve",
        "--model",
        str(model),
        "--port",
        str(port),
        "--metrics-port",
        str(metrics_port),
        "--max-queue",
        str(max_queue),
        "--log-level",
        "INFO",
    ]
    with log.open("wb") as out:
        process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    return ServerProcess(
        process, f"127.0.0.1:{port}", f"http://127.0.0.1:{metrics_port}/metrics", log
    )
