"""When and how long to wait before retrying an UNAVAILABLE completion.

Only a completion that has not yet received anything is retried: once a token
arrived the caller may have shown it, and a retry would show different text.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import grpc


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with jitter for UNAVAILABLE before the first token.

    Attempt n (n = 1 for the first retry) waits a random time between half and
    all of min(max_backoff_s, initial_backoff_s * multiplier ** (n - 1)), so
    that many clients that lost the same server do not come back in lockstep.
    """

    max_attempts: int = 4  # attempts in all, the first included; 1 disables retries
    initial_backoff_s: float = 0.1
    max_backoff_s: float = 2.0
    multiplier: float = 2.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts is {self.max_attempts}; must be at least 1")
        if not 0 < self.initial_backoff_s <= self.max_backoff_s:
            raise ValueError(
                "initial_backoff_s must be positive and at most max_backoff_s "
                f"(got {self.initial_backoff_s} and {self.max_backoff_s})"
            )
        if self.multiplier < 1:
            raise ValueError(f"multiplier is {self.multiplier}; must be at least 1")

    def backoff(self, retry: int, rng: random.Random | None = None) -> float:
        """Seconds to wait before retry number `retry` (1-based)."""
        ceiling = min(self.max_backoff_s, self.initial_backoff_s * self.multiplier ** (retry - 1))
        return ceiling * (0.5 + 0.5 * (rng or random).random())


NO_RETRY = RetryPolicy(max_attempts=1)


def should_retry(
    policy: RetryPolicy,
    code: grpc.StatusCode,
    *,
    attempts: int,
    received: bool,
    delay: float,
    remaining: float | None,
) -> bool:
    """Retry only UNAVAILABLE, only before anything was received, only within the deadline."""
    return (
        code == grpc.StatusCode.UNAVAILABLE
        and not received
        and attempts < policy.max_attempts
        and (remaining is None or remaining > delay)
    )
