"""The asyncio client: the same shape as Client, with `async for` and `await`."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any, Unpack

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from nib.sdk.aio_session import AsyncSession
from nib.sdk.aio_stream import AsyncCompletionStream
from nib.sdk.client import health_name, model_info_from_pb
from nib.sdk.connection import DEFAULT_ADDRESS, ConnectionOptions, open_aio_channel
from nib.sdk.errors import NibError, Unavailable, from_rpc_error
from nib.sdk.request import CompletionParams, build_request
from nib.sdk.retry import RetryPolicy
from nib.sdk.types import ModelInfo
from nib.v1 import completion_pb2 as pb
from nib.v1 import completion_pb2_grpc as pb_grpc


class AsyncClient:
    """An asyncio client of one nib server, on one channel reused by every call.

    Takes the same options as Client. The channel is opened on first use,
    inside the running event loop; use the client from that loop only.

        async with AsyncClient("127.0.0.1:50051") as client:
            async for text in client.complete("def fib(n):", max_tokens=32):
                print(text, end="")
    """

    def __init__(
        self,
        address: str = DEFAULT_ADDRESS,
        *,
        tls: bool = False,
        ca_file: str | Path | None = None,
        server_name: str | None = None,
        api_key: str | None = None,
        timeout: float | None = None,
        keepalive_s: float | None = None,
        retry: RetryPolicy | None = None,
        options: ConnectionOptions | None = None,
    ) -> None:
        self.options = options or ConnectionOptions(
            address=address,
            tls=tls,
            ca_file=ca_file,
            server_name=server_name,
            api_key=api_key,
            timeout=timeout,
            keepalive_s=keepalive_s,
            retry=retry or RetryPolicy(),
        )
        self._channel: grpc.aio.Channel | None = None
        self._stubs: tuple[Any, Any] | None = None

    @property
    def address(self) -> str:
        return self.options.address

    def _stub(self) -> Any:
        return self._open()[0]

    def _open(self) -> tuple[Any, Any]:
        if self._stubs is None:
            self._channel = open_aio_channel(self.options)
            self._stubs = (
                pb_grpc.CompletionServiceStub(self._channel),
                health_pb2_grpc.HealthStub(self._channel),
            )
        return self._stubs

    def complete(
        self,
        prompt: str | None = None,
        *,
        prefix: str | None = None,
        suffix: str | None = None,
        timeout: float | None = None,
        session_id: str | None = None,
        **params: Unpack[CompletionParams],
    ) -> AsyncCompletionStream:
        """Start a completion; `async for` the result for text deltas (see Client.complete)."""
        request = build_request(prompt, prefix=prefix, suffix=suffix, **params)
        metadata = self.options.metadata(session_id) or None
        stub = self._stub()

        def start(remaining: float | None) -> Any:
            return stub.Complete(request, timeout=remaining, metadata=metadata)

        return AsyncCompletionStream(
            start, request.request_id, self.options.retry, self.options.deadline(timeout)
        )

    def session(self, session_id: str | None = None) -> AsyncSession:
        """A session: each completion started on it supersedes the one in flight.
        session_id names it to the server (default: a random id per session)."""
        return AsyncSession(self._stub(), self.options, session_id)

    # `timeout` is the gRPC deadline, which the server sees too (not just a local wait).
    async def model_info(self, *, timeout: float | None = None) -> ModelInfo:  # noqa: ASYNC109
        try:
            r = await self._stub().GetModelInfo(
                pb.GetModelInfoRequest(),
                timeout=self.options.deadline(timeout),
                metadata=self.options.metadata() or None,
            )
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None
        return model_info_from_pb(r)

    async def health(self, service: str = "", *, timeout: float = 5.0) -> str:  # noqa: ASYNC109
        """The server's health status name: SERVING, NOT_SERVING, ... (raises if unreachable)."""
        try:
            r = await self._open()[1].Check(
                health_pb2.HealthCheckRequest(service=service),
                timeout=timeout,
                metadata=self.options.metadata() or None,
            )
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None
        return health_name(r.status)

    async def wait_ready(self, timeout: float = 60.0, *, poll_s: float = 0.2) -> None:  # noqa: ASYNC109
        """Wait until the server reports SERVING; Unavailable when `timeout` passes first."""
        deadline = time.monotonic() + timeout
        last = "no answer"
        while True:
            try:
                last = await self.health(timeout=max(min(deadline - time.monotonic(), 1.0), 0.01))
            except NibError as exc:
                last = str(exc)
            if last == "SERVING":
                return
            if time.monotonic() + poll_s > deadline:
                raise Unavailable(
                    grpc.StatusCode.UNAVAILABLE,
                    f"{self.address} not SERVING after {timeout:g}s ({last})",
                )
            await asyncio.sleep(poll_s)

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
        self._channel, self._stubs = None, None

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
