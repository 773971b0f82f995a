"""Typed errors: one exception class per gRPC status a caller may want to handle."""

from __future__ import annotations

import grpc


class NibError(Exception):
    """A failed call; `code` is the gRPC status, `message` the server's words."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message


class InvalidArgument(NibError):
    """The request was rejected; the message names the field and the limit."""


class Unauthenticated(NibError):
    """Missing or wrong API key."""


class ResourceExhausted(NibError):
    """The server's queue is full; try again later."""


class Unavailable(NibError):
    """The server cannot be reached or is not ready."""


class DeadlineExceeded(NibError):
    """The call's deadline passed."""


class Cancelled(NibError):
    """The call was cancelled."""


_BY_CODE: dict[grpc.StatusCode, type[NibError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.CANCELLED: Cancelled,
}


def from_rpc_error(error: grpc.RpcError) -> NibError:
    code = error.code() if isinstance(error, grpc.Call) else grpc.StatusCode.UNKNOWN
    details = error.details() if isinstance(error, grpc.Call) else str(error)
    return _BY_CODE.get(code, NibError)(code, details or "")


def from_code(code_value: int, message: str) -> NibError:
    code = next((c for c in grpc.StatusCode if c.value[0] == code_value), grpc.StatusCode.UNKNOWN)
    return _BY_CODE.get(code, NibError)(code, message)
