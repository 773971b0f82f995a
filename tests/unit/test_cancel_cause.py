"""service.servicer.cancel_cause: a deadline or a client that went away, from the time left."""

from __future__ import annotations

import pytest

from nib.service.servicer import cancel_cause


class Context:
    """What cancel_cause reads of a grpc.aio.ServicerContext."""

    def __init__(self, remaining: float | None) -> None:
        self.remaining = remaining

    def time_remaining(self) -> float | None:
        return self.remaining


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
