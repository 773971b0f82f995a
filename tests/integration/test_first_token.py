"""Nothing between the engine and the client waits: a token leaves for the client the
moment the engine has it, and the SDK takes it in on the thread that iterates.

bench/wire_trace.py measures each hop of that path; these tests catch the regressions
that would cost a step or a thread hop on every token, without timing anything finer
than seconds.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from nib.sdk import Client

from .conftest import ServerProcess, start_server, stop_server

STEP_DELAY_S = 2.0  # every decode step takes this much longer (fault injection)


@pytest.fixture(scope="module")
def stalled_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The shipped model, with an engine that stalls STEP_DELAY_S after every token."""
    proc = start_server(
        None,
        tmp_path_factory.mktemp("logs") / "stalled-server.log",
        env={"NIB_FAULT_INJECTION": f"step_delay_s={STEP_DELAY_S}"},
    )
    yield proc
    stop_server(proc)


@pytest.mark.slow
@pytest.mark.parametrize("rpc", ["Complete", "Session"])
def test_the_first_token_does_not_wait_for_the_next_step(
    stalled_server: ServerProcess, rpc: str
) -> None:
    """One token, then the engine stalls before it can end the completion: the token
    must reach the client long before the stall is over (a sink, servicer or SDK that
    held a token back until the next event would deliver it with the Done)."""
    with Client(stalled_server.address) as client:
        client.complete("def add(a, b):", max_tokens=1).result()  # warm: connected
        session = client.session() if rpc == "Session" else None
        start = time.perf_counter()
        stream = (session or client).complete("def add(a, b):", max_tokens=1)
        stream.result()
        ended = time.perf_counter() - start
        if session is not None:
            session.close()
    assert stream.usage.completion_tokens == len(stream.token_times) == 1
    first = stream.token_times[0] - start
    assert ended >= STEP_DELAY_S  # the stall happened, after the token
    assert first < STEP_DELAY_S / 2, (first, ended)


def test_a_completion_stream_needs_no_thread_of_its_own(server: ServerProcess) -> None:
    """The SDK's Complete stream is driven by the thread that iterates it: no helper
    thread started per call (gRPC's default starts one whenever no other call is open,
    and every response then crosses from it to the iterating thread)."""
    during: set[threading.Thread] | None = None
    with Client(server.address) as client:
        client.complete("def add(a, b):\n", max_tokens=2).result()  # connected, nothing open
        before = set(threading.enumerate())
        for _text in client.complete("def add(a, b):\n", max_tokens=64):
            during = set(threading.enumerate())  # the call is open: a response just came in
            break
    assert during is not None, "the completion brought no text"
    assert during - before == set(), sorted(t.name for t in during - before)
