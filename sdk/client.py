"""The synchronous client: completions, sessions, model info and health on one channel."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Unpack

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from nib.sdk.connection import DEFAULT_ADDRESS, SESSION_ID_HEADER, ConnectionOptions, open_channel
from nib.sdk.errors import NibError, Unavailable, from_rpc_error
from nib.sdk.request import CompletionParams, build_request
from nib.sdk.retry import RetryPolicy
from nib.sdk.session import Session
from nib.sdk.stream import CompletionStream
from nib.sdk.types import ModelInfo
from nib.v1 import completion_pb2 as pb
from nib.v1 import completion_pb2_grpc as pb_grpc


def model_info_from_pb(r: pb.GetModelInfoResponse) -> ModelInfo:
    return ModelInfo(
        model=r.model,
        architecture=r.architecture,
        context_length=r.context_length,
        vocab_size=r.vocab_size,
        device=r.device,
        dtype=r.dtype,
        quantization=r.quantization,
        max_tokens_limit=r.max_tokens_limit,
        supports_infill=r.supports_infill,
        server_version=r.server_version,
        graphs=tuple((g.name, g.ready, g.fallback) for g in r.graphs),
        speculative_k=r.speculation.draft_tokens,
        verify_costs=tuple((c.tokens, c.decode_steps) for c in r.speculation.verify_costs),
    )


def health_name(status: int) -> str:
    name: str = health_pb2.HealthCheckResponse.ServingStatus.Name(status)
    return name


class Client:
    """A client of one nib server, on one channel reused by every call.

    Thread-safe: share one Client between threads. Options (see
    ConnectionOptions): `tls` (system roots) or `ca_file`, `api_key` (sent as
    `authorization: Bearer <key>`), `timeout` (default deadline per call, in
    seconds), `keepalive_s`, `retry` (UNAVAILABLE before the first token).
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
        self._channel = open_channel(self.options)
        self._stub = pb_grpc.CompletionServiceStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)

    @property
    def address(self) -> str:
        return self.options.address

    def complete(
        self,
        prompt: str | None = None,
        *,
        prefix: str | None = None,
        suffix: str | None = None,
        timeout: float | None = None,
        session_id: str | None = None,
        **params: Unpack[CompletionParams],
    ) -> CompletionStream:
        """Start a completion; iterate the result for text deltas.

        Give `prompt`, or `prefix` and `suffix` for fill-in-the-middle (with
        `path` and `language` of the file, where the model can use them).
        max_tokens 0 means the server's default; temperature 0 is greedy;
        `stop` is a list of strings that end the completion. See
        CompleteRequest in proto/nib/v1/completion.proto for every field.
        Give the same `session_id` to every completion of one editing session:
        they then reuse the server's cached prompt prefix and, behind a load
        balancer, land on the same replica.
        """
        request = build_request(prompt, prefix=prefix, suffix=suffix, **params)
        metadata = self.options.metadata(session_id) or None

        def start(remaining: float | None) -> grpc.Call:
            return self._stub.Complete(request, timeout=remaining, metadata=metadata)

        return CompletionStream(
            start, request.request_id, self.options.retry, self.options.deadline(timeout)
        )

    def session(self, session_id: str | None = None) -> Session:
        """A session: each completion started on it supersedes the one in flight.
        session_id names it to the server (default: a random id per session)."""
        return Session(self._stub, self.options, session_id)

    def model_info(self, *, timeout: float | None = None) -> ModelInfo:
        try:
            r = self._stub.GetModelInfo(
                pb.GetModelInfoRequest(),
                timeout=self.options.deadline(timeout),
                metadata=self.options.metadata() or None,
            )
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None
        return model_info_from_pb(r)

    def health(self, service: str = "", *, timeout: float = 5.0) -> str:
        """The server's health status name: SERVING, NOT_SERVING, ... (raises if unreachable)."""
        try:
            r = self._health.Check(
                health_pb2.HealthCheckRequest(service=service),
                timeout=timeout,
                metadata=self.options.metadata() or None,
            )
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None
        return health_name(r.status)

    def wait_ready(self, timeout: float = 60.0, *, poll_s: float = 0.2) -> None:
        """Block until the server reports SERVING; Unavailable when `timeout` passes first."""
        deadline = time.monotonic() + timeout
        last = "no answer"
        while True:
            try:
                last = self.health(timeout=max(min(deadline - time.monotonic(), 1.0), 0.01))
            except NibError as exc:
                last = str(exc)
            if last == "SERVING":
                return
            if time.monotonic() + poll_s > deadline:
                raise Unavailable(
                    grpc.StatusCode.UNAVAILABLE,
                    f"{self.address} not SERVING after {timeout:g}s ({last})",
                )
            time.sleep(poll_s)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["DEFAULT_ADDRESS", "SESSION_ID_HEADER", "Client", "CompletionStream", "Session"]
