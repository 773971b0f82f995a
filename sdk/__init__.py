"""nib's client SDK: stream code completions from a nib server.

from nib.sdk import Client
with Client("127.0.0.1:50051") as client:
    for text in client.complete("def fib(n):", max_tokens=32):
        print(text, end="", flush=True)
"""

from nib.sdk.client import DEFAULT_ADDRESS, Client, CompletionStream
from nib.sdk.errors import (
    Cancelled,
    DeadlineExceeded,
    InvalidArgument,
    NibError,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
)
from nib.sdk.types import ModelInfo, Timings, Usage

__all__ = [
    "DEFAULT_ADDRESS",
    "Cancelled",
    "Client",
    "CompletionStream",
    "DeadlineExceeded",
    "InvalidArgument",
    "ModelInfo",
    "NibError",
    "ResourceExhausted",
    "Timings",
    "Unauthenticated",
    "Unavailable",
    "Usage",
]
