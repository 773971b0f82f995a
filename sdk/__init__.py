"""nib's client SDK: stream code completions from a nib server.

    from nib.sdk import Client
    with Client("127.0.0.1:50051") as client:
        for text in client.complete("def fib(n):", max_tokens=32):
            print(text, end="", flush=True)

AsyncClient has the same shape for asyncio (`async for`, `await`). Sessions
(`client.session()`) let a newer completion supersede the one in flight.
The SDK needs grpcio and protobuf only, never torch.
"""

from nib.sdk.aio_client import AsyncClient
from nib.sdk.aio_session import AsyncSession, AsyncSessionStream
from nib.sdk.aio_stream import AsyncCompletionStream
from nib.sdk.client import Client
from nib.sdk.connection import DEFAULT_ADDRESS, ConnectionOptions
from nib.sdk.errors import (
    Cancelled,
    DeadlineExceeded,
    InvalidArgument,
    NibError,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
)
from nib.sdk.retry import NO_RETRY, RetryPolicy
from nib.sdk.session import Session, SessionStream
from nib.sdk.stream import CompletionStream
from nib.sdk.types import Completion, FinishReason, ModelInfo, Timings, Usage

__all__ = [
    "DEFAULT_ADDRESS",
    "NO_RETRY",
    "AsyncClient",
    "AsyncCompletionStream",
    "AsyncSession",
    "AsyncSessionStream",
    "Cancelled",
    "Client",
    "Completion",
    "CompletionStream",
    "ConnectionOptions",
    "DeadlineExceeded",
    "FinishReason",
    "InvalidArgument",
    "ModelInfo",
    "NibError",
    "PermissionDenied",
    "ResourceExhausted",
    "RetryPolicy",
    "Session",
    "SessionStream",
    "Timings",
    "Unauthenticated",
    "Unavailable",
    "Usage",
]
