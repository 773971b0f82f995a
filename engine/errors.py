"""Errors the engine raises at its door; the service maps each to one gRPC status."""

from __future__ import annotations


class EngineError(Exception):
    """Base class."""


class InvalidRequest(EngineError):
    """A request the engine cannot run. `field` names the offending request field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class QueueFull(EngineError):
    """Too many requests are waiting."""


class EngineUnavailable(EngineError):
    """The engine is not ready (warming up) or has stopped."""
