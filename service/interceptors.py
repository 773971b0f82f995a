"""Run code around every RPC: a guard is an async context manager entered for the
whole call (all of a stream), in the call's own task, so that a ContextVar it
sets is seen by the handler and by the tasks the handler starts.

gRPC's asyncio server calls a handler in one of two styles: an async generator
(yields responses) or a coroutine (writes with context.write, returns None);
the wrapper keeps the style of the handler it wraps.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import grpc

Guard = Callable[
    [grpc.HandlerCallDetails, grpc.aio.ServicerContext], AbstractAsyncContextManager[None]
]
Handler = Callable[..., Any]
_KINDS = ("unary_unary", "unary_stream", "stream_unary", "stream_stream")


def guarded(inner: Handler, details: grpc.HandlerCallDetails, guard: Guard) -> Handler:
    if inspect.isasyncgenfunction(inner):

        async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            async with guard(details, context):
                async for item in inner(request, context):
                    yield item

        return stream
    if inspect.iscoroutinefunction(inner):

        async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
            async with guard(details, context):
                return await inner(request, context)

        return call
    return inner  # a synchronous handler runs in an executor thread: nothing to wrap


class GuardInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Wraps the handler of every method for which `applies(method)` holds in `guard`."""

    def __init__(self, guard: Guard, applies: Callable[[str], bool] = lambda _: True) -> None:
        self._guard = guard
        self._applies = applies

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or not self._applies(details.method):
            return handler
        for kind in _KINDS:
            inner = getattr(handler, kind)
            if inner is not None:
                return handler._replace(**{kind: guarded(inner, details, self._guard)})
        return handler
