"""The synchronous client: stream completions, read model info and health."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from types import TracebackType

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from nib.sdk.errors import NibError, from_code, from_rpc_error
from nib.sdk.types import ModelInfo, Timings, Usage
from nib.v1 import completion_pb2 as pb
from nib.v1 import completion_pb2_grpc as pb_grpc

DEFAULT_ADDRESS = "127.0.0.1:50051"
# Names the caller's editing session: the server keys its prompt-prefix cache by it and a
# load balancer in front of several replicas (deploy/envoy) hashes it to pick the replica.
SESSION_ID_HEADER = "nib-session-id"

_FINISH_NAMES = {
    value: name.removeprefix("FINISH_REASON_").lower() for name, value in pb.FinishReason.items()
}


def build_request(
    prompt: str | None,
    *,
    prefix: str | None = None,
    suffix: str | None = None,
    path: str = "",
    language: str = "",
    max_tokens: int = 0,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 0.0,
    seed: int | None = None,
    stop: Sequence[str] = (),
    logprobs: bool = False,
    request_id: str | None = None,
) -> pb.CompleteRequest:
    """A CompleteRequest from keyword arguments; exactly one of prompt or prefix/suffix."""
    if (prompt is None) == (prefix is None and suffix is None):
        raise ValueError("give either prompt, or prefix and/or suffix (fill-in-the-middle)")
    req = pb.CompleteRequest(
        max_tokens=max_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        stop=list(stop),
        logprobs=logprobs,
        request_id=request_id or uuid.uuid4().hex,
    )
    if prompt is not None:
        req.prompt = prompt
    else:
        req.infill.CopyFrom(
            pb.Infill(prefix=prefix or "", suffix=suffix or "", path=path, language=language)
        )
    if seed is not None:
        req.seed = seed
    return req


class CompletionStream:
    """Iterate for text deltas as they arrive. When the iteration ends, `text`,
    `finish_reason`, `usage` and `timings` describe the whole completion.

    Breaking out of the loop does not stop the server by itself: call close()
    or cancel(), or use the stream as a context manager.
    """

    def __init__(self, call: grpc.Call, request_id: str) -> None:
        self._call = call
        self.request_id = request_id
        self.text = ""
        self.token_ids: list[int] = []
        self.logprobs: list[float] = []
        self.finish_reason: str | None = None
        self.stop: str = ""
        self.usage = Usage()
        self.timings = Timings()

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def __iter__(self) -> Iterator[str]:
        return self._deltas()

    def _deltas(self) -> Iterator[str]:
        try:
            for response in self._call:
                if response.HasField("delta"):
                    d = response.delta
                    self.token_ids.extend(d.token_ids)
                    self.logprobs.extend(d.logprobs)
                    if d.text:
                        self.text += d.text
                        yield d.text
                elif response.HasField("done"):
                    self._finish(response.done)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.CANCELLED and self.finish_reason == "cancelled":
                return
            raise from_rpc_error(exc) from None

    def _finish(self, done: pb.Done) -> None:
        self.finish_reason = _FINISH_NAMES.get(done.finish_reason, "unspecified")
        self.stop = done.stop
        self.usage = Usage(
            done.usage.prompt_tokens, done.usage.completion_tokens, done.usage.cached_prompt_tokens
        )
        t = done.timings
        self.timings = Timings(t.queue_ms, t.ttft_ms, t.total_ms, tuple(t.inter_token_ms))
        if done.finish_reason == pb.FINISH_REASON_ERROR:
            raise from_code(done.error_code or grpc.StatusCode.INTERNAL.value[0], done.error)

    def cancel(self) -> None:
        """Stop the generation on the server (it stops within one decode step)."""
        if not self.done:
            self.finish_reason = "cancelled"
            self._call.cancel()

    close = cancel

    def __enter__(self) -> CompletionStream:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cancel()


class Client:
    """A thread-safe client on one channel, reused across calls."""

    def __init__(self, address: str = DEFAULT_ADDRESS, *, timeout: float | None = None) -> None:
        self.address = address
        self.timeout = timeout
        self._channel = grpc.insecure_channel(address)
        self._stub = pb_grpc.CompletionServiceStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)

    def complete(
        self,
        prompt: str | None = None,
        *,
        prefix: str | None = None,
        suffix: str | None = None,
        path: str = "",
        language: str = "",
        max_tokens: int = 0,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 0.0,
        seed: int | None = None,
        stop: Sequence[str] = (),
        logprobs: bool = False,
        request_id: str | None = None,
        timeout: float | None = None,
        session_id: str | None = None,
    ) -> CompletionStream:
        """Start a completion; iterate the result for text deltas.

        Give `prompt`, or `prefix` and `suffix` for fill-in-the-middle. 0 for
        max_tokens means the server's default; temperature 0 is greedy. See
        CompleteRequest in proto/nib/v1/completion.proto for every field.
        Give the same `session_id` to every completion of one editing session:
        they then reuse the server's cached prompt prefix and, behind a load
        balancer, land on the same replica.
        """
        request = build_request(
            prompt,
            prefix=prefix,
            suffix=suffix,
            path=path,
            language=language,
            max_tokens=max_tokens,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            seed=seed,
            stop=stop,
            logprobs=logprobs,
            request_id=request_id,
        )
        metadata = ((SESSION_ID_HEADER, session_id),) if session_id else None
        call = self._stub.Complete(request, timeout=timeout or self.timeout, metadata=metadata)
        return CompletionStream(call, request.request_id)

    def model_info(self) -> ModelInfo:
        try:
            r = self._stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=self.timeout)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None
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
        )

    def health(self, service: str = "", *, timeout: float = 5.0) -> str:
        """The server's health status name: SERVING, NOT_SERVING, ... (raises if unreachable)."""
        try:
            r = self._health.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None
        name: str = health_pb2.HealthCheckResponse.ServingStatus.Name(r.status)
        return name

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = [
    "DEFAULT_ADDRESS",
    "SESSION_ID_HEADER",
    "Client",
    "CompletionStream",
    "NibError",
    "build_request",
]
