"""A real `nib serve` process on 127.0.0.1 for the integration tests."""

from __future__ import annotations

import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from nib.sdk import AsyncClient, Client, NibError


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class ServerProcess:
    address: str
    process: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def start_server(
    model_dir: Path | None, log: Path, *extra: str, port: int | None = None
) -> ServerProcess:
    port = port or free_port()
    cmd = [sys.executable, "-m", "nib.sdk.cli", "serve", "--port", str(port), *extra]
    if model_dir is not None:
        cmd += ["--model", str(model_dir)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    server = ServerProcess(f"127.0.0.1:{port}", proc, log)
    deadline = time.monotonic() + 120
    with Client(server.address) as client:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"nib serve exited with {proc.returncode}:\n{server.output()}")
            try:
                if client.health(timeout=1.0) == "SERVING":
                    return server
            except NibError:
                pass
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"nib serve did not become SERVING:\n{server.output()}")


def stop_server(server: ServerProcess) -> None:
    if server.process.poll() is None:
        server.process.send_signal(signal.SIGTERM)
        try:
            server.process.wait(30)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait()


# A cancel reaches the server when the next request starts within a few decode steps:
# a generation that kept running would hold the (one-request-at-a-time) engine for minutes.
def assert_engine_free(client: Client) -> None:
    """The next request starts within a few decode steps: nothing runs on the engine."""
    nxt = client.complete("y", max_tokens=4).result()
    step_ms = statistics.median(nxt.timings.inter_token_ms)
    assert nxt.timings.queue_ms < 20 * step_ms + 250, (nxt.timings, step_ms)


async def assert_engine_free_async(client: AsyncClient) -> None:
    nxt = await client.complete("y", max_tokens=4).result()
    step_ms = statistics.median(nxt.timings.inter_token_ms)
    assert nxt.timings.queue_ms < 20 * step_ms + 250, (nxt.timings, step_ms)


@pytest.fixture(scope="session")
def slow_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random model big enough that 1000 tokens take seconds on a CPU (to see cancels)."""
    from nib.engine.default_model import make_random_model

    return make_random_model(
        tmp_path_factory.mktemp("slow-model"), hidden_size=512, intermediate_size=1536, num_layers=6
    )


@pytest.fixture(scope="session")
def server(
    slow_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    proc = start_server(slow_model_dir, tmp_path_factory.mktemp("logs") / "server.log")
    yield proc
    stop_server(proc)
