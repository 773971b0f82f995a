"""Exceptions become gRPC statuses here, in one interceptor, for every RPC."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from nib.engine.errors import EngineUnavailable, InvalidRequest, QueueFull

log = logging.getLogger("nib.service")

STATUS_OF: tuple[tuple[type[Exception], grpc.StatusCode], ...] = (
    (InvalidRequest, grpc.StatusCode.INVALID_ARGUMENT),
    (QueueFull, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (EngineUnavailable, grpc.StatusCode.UNAVAILABLE),
)


def status_for(exc: Exception) -> grpc.StatusCode | None:
    for kind, code in STATUS_OF:
        if isinstance(exc, kind):
            return code
    return None


class ErrorInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Maps engine errors to statuses; anything else becomes INTERNAL, logged once."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None:
            return handler
        method = details.method
        if handler.unary_unary is not None:
            inner_uu = handler.unary_unary

            async def unary_unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
                try:
                    return await inner_uu(request, context)
                except Exception as exc:
                    await _abort(exc, context, method)

            return handler._replace(unary_unary=unary_unary)
        if handler.unary_stream is not None:
            inner_us = handler.unary_stream

            async def unary_stream(
                request: Any, context: grpc.aio.ServicerContext
            ) -> AsyncIterator[Any]:
                try:
                    async for item in inner_us(request, context):
                        yield item
                except Exception as exc:
                    await _abort(exc, context, method)

            return handler._replace(unary_stream=unary_stream)
        if handler.stream_stream is not None:
            inner_ss = handler.stream_stream

            async def stream_stream(
                requests: Any, context: grpc.aio.ServicerContext
            ) -> AsyncIterator[Any]:
                try:
                    async for item in inner_ss(requests, context):
                        yield item
                except Exception as exc:
                    await _abort(exc, context, method)

            return handler._replace(stream_stream=stream_stream)
        return handler


async def _abort(exc: Exception, context: grpc.aio.ServicerContext, method: str) -> None:
    if isinstance(exc, grpc.aio.AbortError):
        raise exc
    code = status_for(exc)
    if code is None:
        log.exception("unexpected error in %s", method)
        await context.abort(grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}")
    await context.abort(code, str(exc))
