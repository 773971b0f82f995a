"""The `nib` command against the real server: streaming, options, JSON lines, Ctrl-C, health."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from typing import Any

from nib.sdk import Client

from .conftest import ServerProcess, assert_cancelled_on_server, assert_engine_free, free_port

LONG_ARGS = ("--max-tokens", "1000", "--temperature", "1", "--seed", "1")


def nib(
    slow_server: ServerProcess | None, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ}
    if slow_server is not None:
        env["NIB_ADDRESS"] = slow_server.address
    return subprocess.run(
        [sys.executable, "-m", "nib.sdk.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        input=stdin,
        timeout=120,
    )


def json_lines(out: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    lines = [json.loads(line) for line in out.splitlines()]
    assert lines and lines[-1]["type"] == "done", out
    assert all(line["type"] == "delta" for line in lines[:-1])
    return lines[:-1], lines[-1]


def test_json_lines_stream_deltas_then_a_done(slow_server: ServerProcess) -> None:
    args = (
        "complete",
        "def add(a, b):",
        "--max-tokens",
        "16",
        "--temperature",
        "0.8",
        "--seed",
        "3",
    )
    run = nib(slow_server, *args, "--json")
    assert run.returncode == 0, run.stderr
    deltas, done = json_lines(run.stdout)
    assert len(deltas) > 1 and "".join(d["text"] for d in deltas) == done["text"]
    assert done["finish_reason"] in ("length", "end_of_text")
    assert 0 < done["usage"]["completion_tokens"] <= 16
    assert done["timings"]["ttft_ms"] > 0 and len(done["timings"]["inter_token_ms"]) >= 1
    again = nib(slow_server, *args, "--json")
    assert json_lines(again.stdout)[1]["text"] == done["text"], "same seed, same text"


def test_stop_string_ends_the_completion_before_it(slow_server: ServerProcess) -> None:
    greedy = json_lines(
        nib(slow_server, "complete", "def g(x):", "--max-tokens", "40", "--json").stdout
    )
    text = greedy[1]["text"]
    # A stop string the model will produce: two printable ASCII characters seen once, late enough.
    index, stop = next(
        (i, text[i : i + 2])
        for i in range(4, len(text) - 2)
        if text[i : i + 2].isascii()
        and text[i : i + 2].isprintable()
        and text.find(text[i : i + 2]) == i
    )
    run = nib(slow_server, "complete", "def g(x):", "--max-tokens", "40", "--json", "--stop", stop)
    done = json_lines(run.stdout)[1]
    assert done["finish_reason"] == "stop" and done["stop"] == stop
    assert done["text"] == text[:index]


def test_suffix_makes_it_fill_in_the_middle(slow_server: ServerProcess) -> None:
    run = nib(
        slow_server,
        "complete",
        "def add(a, b):\n",
        "--suffix",
        "\nprint(1)\n",
        "--max-tokens",
        "3",
        "--json",
    )
    assert run.returncode == 0, run.stderr
    done = json_lines(run.stdout)[1]
    # One token per byte, plus the three FIM tokens.
    assert done["usage"]["prompt_tokens"] == len("def add(a, b):\n") + len("\nprint(1)\n") + 3


def test_prompt_from_stdin_and_verbose_timings(slow_server: ServerProcess) -> None:
    run = nib(slow_server, "complete", "-", "--max-tokens", "6", "-v", stdin="class A:\n")
    assert run.returncode == 0, run.stderr
    assert "[length] 9 prompt + 6 completion tokens" in run.stderr  # 9 bytes read from stdin
    for word in ("ttft", "queue", "total", "tok/s"):
        assert word in run.stderr, run.stderr


def test_ctrl_c_cancels_the_generation_on_the_server(slow_server: ServerProcess) -> None:
    env = {**os.environ, "NIB_ADDRESS": slow_server.address, "PYTHONUNBUFFERED": "1"}
    # A terminal's Ctrl-C reaches a program whose SIGINT is the default. A test run started
    # in the background of a shell without job control inherits SIGINT ignored, and so
    # would nib (as POSIX means it to); so the child restores the default before exec.
    argv = [sys.executable, "-m", "nib.sdk.cli", "complete", "x", "--json", *LONG_ARGS]
    restore = "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    restore += "os.execv(sys.argv[1], sys.argv[1:])"
    proc = subprocess.Popen(
        [sys.executable, "-c", restore, *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    assert proc.stdout is not None and proc.stderr is not None
    try:
        # Text appears while the command still runs: it streams.
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        assert ready and os.read(proc.stdout.fileno(), 1) and proc.poll() is None
        time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 130
        done = json.loads(proc.stdout.read().decode().splitlines()[-1])
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert done["type"] == "done" and done["finish_reason"] == "cancelled"
    with Client(slow_server.address) as client:
        assert_engine_free(client)
    assert_cancelled_on_server(slow_server, done["request_id"], "client_gone")


def test_bad_input_exits_1_with_the_servers_message(slow_server: ServerProcess) -> None:
    run = nib(slow_server, "complete", "x", "--max-tokens", "100000")
    assert run.returncode == 1
    assert "INVALID_ARGUMENT: max_tokens: is 100000; must be at most 1024" in run.stderr
    run = nib(slow_server, "complete", "x", "--max-tokens", "100000", "--json")
    error = json.loads(run.stdout.splitlines()[-1])
    assert error == {
        "type": "error",
        "code": "INVALID_ARGUMENT",
        "message": "max_tokens: is 100000; must be at most 1024",
    }


def test_health_and_info(slow_server: ServerProcess) -> None:
    health = nib(slow_server, "health")
    assert health.returncode == 0 and health.stdout.strip() == "SERVING"
    waited = nib(slow_server, "health", "--wait", "10")
    assert waited.returncode == 0 and waited.stdout.strip() == "SERVING"
    info = nib(slow_server, "info", "--json")
    assert info.returncode == 0, info.stderr
    described = json.loads(info.stdout)
    assert described["architecture"] == "llama" and described["max_tokens_limit"] == 1024
    assert described["supports_infill"] is True
    assert described["speculative_k"] == 6 and described["verify_costs"] == []


def test_unreachable_server_is_reported() -> None:
    nobody = f"127.0.0.1:{free_port()}"
    health = nib(None, "health", "--address", nobody, "--timeout", "1")
    assert health.returncode == 1 and "UNAVAILABLE" in health.stderr
    waited = nib(None, "health", "--address", nobody, "--wait", "1")
    assert waited.returncode == 1 and "not SERVING after 1s" in waited.stderr
    complete = nib(None, "complete", "x", "--address", nobody)
    assert complete.returncode == 1 and "UNAVAILABLE" in complete.stderr
