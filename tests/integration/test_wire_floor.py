"""bench/wire_floor.py, the floor under bench/wire_trace.py's figures, in both of gRPC's
server flavours on 127.0.0.1: each serves the tokens its engine thread makes, and the
trace reads the same stamps through either server and either SDK client."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from nib.sdk import Client

from .conftest import free_port

ROOT = Path(__file__).resolve().parents[2]


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"{name}_bench", ROOT / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def floor() -> ModuleType:
    return load("wire_floor")


@pytest.fixture
def sync_floor(floor: ModuleType) -> Iterator[str]:
    """The sync floor in this process: 1 ms of prefill, then a token every 1 ms."""
    port = free_port()
    floor.STAMPS.clear()
    server = floor.serve_sync(port, 0.001, 0.001)
    yield f"127.0.0.1:{port}"
    server.stop(0).wait()


def test_the_sync_floor_serves_the_tokens(floor: ModuleType, sync_floor: str) -> None:
    with Client(sync_floor) as client:
        client.wait_ready(10)
        stream = client.complete("def f():", max_tokens=5)
        result = stream.result()
    assert list(result.token_ids) == [0, 1, 2, 3, 4]
    assert result.text == "xxxxx" and result.finish_reason == "length"
    gaps = result.timings.inter_token_ms
    assert len(gaps) == 4 and all(g >= 0.9 for g in gaps)  # the engine slept 1 ms a step
    assert len(stream.token_times) == 5
    labels = [label for label, _ in floor.STAMPS]
    assert labels == ["intercept", "submit", "first_token", "yielded"]
    times = [t for _, t in floor.STAMPS]
    assert times == sorted(times)


def assert_in_order(row: dict[str, int], path: list[str]) -> None:
    """A request's stamps follow `path`, except `client_called`: it is stamped when
    complete() returns, and by then the call is on its way, so the server may already
    have intercepted it (CI saw this with the sync client on 2 cores). It still lies
    between the client's own stamps."""
    ordered = [label for label in path if label != "client_called"]
    assert [row[label] for label in ordered] == sorted(row[label] for label in ordered)
    assert row["client_send"] <= row["client_called"] <= row["client_first"]


@pytest.mark.parametrize(("server", "client"), [("sync", "aio"), ("aio", "sync")])
def test_the_trace_reads_the_floor_in_either_flavour(
    server: str, client: str, tmp_path: Path
) -> None:
    trace = load("wire_trace")
    out = tmp_path / "trace.json"
    argv = ["--floor", "--floor-server", server, "--client", client, "--stub-ms", "2,1"]
    argv += ["--reps", "3", "--new", "4", "--port", str(free_port()), "--json", str(out)]
    assert trace.main(argv) == 0
    written = json.loads(out.read_text())
    assert (written["floor_server"], written["client"]) == (server, client)
    path = [label for label in trace.ORDER if label in written["rows"][0]]
    hops = "client_send client_called intercept submit first_token yielded client_first"
    assert path == hops.split()
    assert len(written["rows"]) == 3
    for row in written["rows"]:
        assert_in_order(row, path)
    summary = written["summary"]
    assert summary["engine_ttft_ms"] >= 2.0  # the stub's prefill
    assert summary["client_ttft_ms"] > summary["engine_ttft_ms"]
    assert summary["engine_inter_token_ms"] >= 0.9


def test_the_floor_server_flavour_needs_the_floor() -> None:
    with pytest.raises(SystemExit) as exit_info:
        load("wire_trace").main(["--floor-server", "sync"])
    assert exit_info.value.code == 2


@pytest.mark.slow
def test_the_trace_follows_completions_on_one_open_session(tmp_path: Path) -> None:
    # nib's own server (shipped model, stubbed forward), every completion a message on
    # one Session: each one's hops are stamped, in order, from its start message on.
    trace = load("wire_trace")
    out = tmp_path / "trace.json"
    argv = ["--path", "session", "--device", "cpu", "--stub-ms", "2,1", "--reps", "3"]
    argv += ["--new", "4", "--port", str(free_port()), "--json", str(out)]
    assert trace.main([*argv, "--switch-us", "250"]) == 0
    written = json.loads(out.read_text())
    assert written["path"] == "session" and len(written["rows"]) == 3
    assert written["switch_interval_us"] == 250  # what the server ran with, not the ask
    for row in written["rows"]:
        # "sink" is stamped when the engine's token() returns, which the event loop can
        # beat to its own stamp (it has the event by then): it has no place in the order.
        path = [label for label in trace.ORDER if label in row and label != "sink"]
        for label in ("intercept", "handler", "submit", "first_token", "yielded"):
            assert label in path, (label, row)
        assert_in_order(row, path)
    assert written["summary"]["engine_ttft_ms"] >= 2.0
    assert written["summary"]["client_ttft_ms"] > written["summary"]["engine_ttft_ms"]


def test_a_session_trace_runs_nibs_server_only() -> None:
    with pytest.raises(SystemExit) as exit_info:
        load("wire_trace").main(["--path", "session", "--floor"])
    assert exit_info.value.code == 2


@pytest.mark.parametrize("argv", [["--switch-us", "0"], ["--floor", "--switch-us", "100"]])
def test_the_switch_interval_is_nibs_servers_and_positive(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        load("wire_trace").main(argv)
    assert exit_info.value.code == 2
    assert "--switch-us must be above 0" in capsys.readouterr().err
