"""The runnable examples in examples/ run against the real server and do what they say."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from .conftest import ServerProcess

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run_example(
    slow_server: ServerProcess, name: str, *args: str
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NIB_ADDRESS": slow_server.address, "PYTHONIOENCODING": "utf-8"}
    run = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
    )
    assert run.returncode == 0, run.stderr
    return run


def test_plain_script_streams_a_fill_in_the_middle(slow_server: ServerProcess) -> None:
    run = run_example(slow_server, "complete.py")
    assert run.stdout.startswith("def fibonacci(n):\n    ")
    assert run.stdout.endswith("\n\nprint(fibonacci(10))\n")
    assert re.search(r"^\[(length|stop|end_of_text)\] \d+ tokens; first token after", run.stderr)


def test_asyncio_agent(slow_server: ServerProcess) -> None:
    lines = run_example(slow_server, "agent_asyncio.py").stdout.splitlines()
    drafts = [line for line in lines if line.startswith("draft ")]
    assert sorted(d.split(":")[0] for d in drafts) == ["draft add", "draft greet", "draft mean"]
    assert any(line.startswith("first line: ") for line in lines)
    plan = next(line for line in lines if line.startswith("plan A: "))
    assert re.match(r"plan A: superseded after \d+ tokens; plan B: (length|end_of_text)", plan)
    assert any(line.startswith("deadline: ") for line in lines)


def test_voice_consumer_speaks_in_sentences_and_stops_on_barge_in(
    slow_server: ServerProcess,
) -> None:
    lines = run_example(slow_server, "voice.py").stdout.splitlines()
    said = [line for line in lines if line.startswith("[say +")]
    assert said and lines[-1] in ("[end] length", "[end] end_of_text")
    interrupted = run_example(
        # A reply too long to end by itself within the half second on any machine.
        slow_server,
        "voice.py",
        "--barge-in-after",
        "0.5",
        "--max-tokens",
        "1000",
    ).stdout.splitlines()
    assert interrupted[-2].startswith("[barge-in] cancelled after")
    assert interrupted[-1] == "[end] cancelled"
