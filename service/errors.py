"""Exceptions become gRPC statuses here, in one place, for every RPC."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import grpc
import structlog

from nib.engine.errors import EngineUnavailable, InvalidRequest, QueueFull
from nib.service.interceptors import GuardInterceptor

log = structlog.get_logger("nib.service")

STATUS_OF: tuple[tuple[type[Exception], grpc.StatusCode], ...] = (
    (InvalidRequest, grpc.StatusCode.INVALID_ARGUMENT),
    (QueueFull, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (EngineUnavailable, grpc.StatusCode.UNAVAILABLE),
)


def status_for(exc: BaseException | None) -> grpc.StatusCode:
    """The status a failed call gets for exc; INTERNAL for anything unforeseen."""
    for kind, code in STATUS_OF:
        if isinstance(exc, kind):
            return code
    return grpc.StatusCode.INTERNAL


def code_number(code: grpc.StatusCode) -> int:
    """google.rpc.Code numbering (as in Done.error_code)."""
    number: int = code.value[0]
    return number


@asynccontextmanager
async def map_errors(
    details: grpc.HandlerCallDetails, context: grpc.aio.ServicerContext
) -> AsyncIterator[None]:
    try:
        yield
    except grpc.aio.AbortError:
        raise
    except Exception as exc:
        code = status_for(exc)
        if code is grpc.StatusCode.INTERNAL:
            log.exception("unexpected error", method=details.method)
            await context.abort(code, f"internal error: {type(exc).__name__}")
        await context.abort(code, str(exc))


def error_interceptor() -> GuardInterceptor:
    """Maps engine errors to statuses; anything else becomes INTERNAL, logged once."""
    return GuardInterceptor(map_errors)
