"""service.servicer.cancel_cause: a deadline or a client that went away, from the time left;
and the handlers that ask it, however gRPC ends them: by cancelling the handler's task or,
when the call ended while the handler waited at a yield, by closing its generator
(GeneratorExit; about one end in ten on loopback)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest

from nib.engine.request import TokenEvent
from nib.service import servicer as servicer_mod
from nib.service.servicer import CompletionServicer, cancel_cause
from nib.v1 import completion_pb2 as pb


class Context:
    """What cancel_cause and the handlers read of a grpc.aio.ServicerContext."""

    def __init__(self, remaining: float | None) -> None:
        self.remaining = remaining

    def time_remaining(self) -> float | None:
        return self.remaining

    def invocation_metadata(self) -> tuple[()]:
        return ()

    async def send_initial_metadata(self, metadata: object) -> None:
        return None


@pytest.mark.parametrize(
    ("remaining", "budget", "cause"),
    [
        (None, None, "client_gone"),  # the call had no deadline
        (-0.001, None, "deadline"),  # past it
        (0.015, None, "deadline"),  # within 20 ms
        (0.030, None, "client_gone"),
        (0.030, 0.8, "deadline"),  # the client's timer, 30 ms ahead of the server's clock
        (0.079, 0.8, "deadline"),  # within 10% of an 0.8 s budget
        (0.200, 0.8, "client_gone"),  # a quarter of the budget left: the client left
        (2.0, 10.0, "client_gone"),
        (0.9, 10.0, "deadline"),
    ],
)
def test_a_cancel_near_the_deadline_is_the_deadline(
    remaining: float | None, budget: float | None, cause: str
) -> None:
    assert cancel_cause(Context(remaining), budget) == cause  # type: ignore[arg-type]


class Tracked:
    request_id = "r1"
    completion = SimpleNamespace(prompt_tokens=1)

    def __init__(self) -> None:
        self.causes: list[str | None] = []

    async def events(self) -> AsyncIterator[TokenEvent]:
        while True:
            yield TokenEvent(text="x", token_ids=(1,))
            await asyncio.sleep(0)

    def release(self, cause: str | None = None) -> None:
        self.causes.append(cause)


class Ledger:
    def __init__(self) -> None:
        self.tracked = Tracked()
        self.sessions: set[object] = set()
        self.draining = False
        gauge = SimpleNamespace(inc=lambda: None, dec=lambda: None)
        self.metrics = SimpleNamespace(sessions=gauge)

    async def open(self, request: object, caller: object, why: object) -> Tracked:
        return self.tracked


class Session:
    """Stands in for SessionStream: one response, then nothing until the end."""

    def __init__(self, ledger: object, caller: object) -> None:
        self.cause = "client_gone"
        self.closed_with: list[str] = []
        SESSIONS.append(self)

    async def read(self, requests: object) -> None:
        await asyncio.Event().wait()

    async def next_out(self) -> pb.SessionResponse:
        return pb.SessionResponse(request_id="r1", delta=pb.Delta(text="x"))

    async def close(self, cause: str) -> None:
        self.closed_with.append(cause)


SESSIONS: list[Session] = []


def make(ledger: Ledger) -> CompletionServicer:
    return CompletionServicer(engine=None, ledger=ledger, server_version="t", telemetry=object())  # type: ignore[arg-type]


@pytest.mark.parametrize(("remaining", "cause"), [(0.0, "deadline"), (5.0, "client_gone")])
@pytest.mark.parametrize("how", ["close", "cancel"])
def test_complete_names_the_cause_however_it_is_ended(
    remaining: float, cause: str, how: str
) -> None:
    async def run() -> list[str | None]:
        ledger, context = Ledger(), Context(5.0)
        gen: Any = make(ledger).Complete(pb.CompleteRequest(prompt="a"), context)
        assert (await anext(gen)).HasField("delta")
        context.remaining = remaining  # the clock moved on
        if how == "close":
            await gen.aclose()  # the call ended while the handler waited at its yield
        else:
            task = asyncio.ensure_future(anext(gen))
            await asyncio.sleep(0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        return ledger.tracked.causes

    assert asyncio.run(run())[0] == cause


@pytest.mark.parametrize(("remaining", "cause"), [(0.0, "deadline"), (5.0, "client_gone")])
def test_session_names_the_cause_when_its_generator_is_closed(
    remaining: float, cause: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(servicer_mod, "SessionStream", Session)
    SESSIONS.clear()

    async def run() -> list[str]:
        context = Context(5.0)
        gen: Any = make(Ledger()).Session(iter(()), context)
        assert (await anext(gen)).HasField("delta")
        context.remaining = remaining
        await gen.aclose()
        return SESSIONS[0].closed_with

    assert asyncio.run(run()) == [cause]
