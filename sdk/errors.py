"""Typed errors: one exception class per gRPC status a caller may want to handle.

Every error carries the status (`code`) and the server's own words
(`message`): for InvalidArgument the message names the field and the limit.
"""

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


class PermissionDenied(NibError):
    """The API key is valid but may not do this."""


class ResourceExhausted(NibError):
    """The server's queue is full; try again later."""


class Unavailable(NibError):
    """The server cannot be reached or is not ready."""


class DeadlineExceeded(NibError):
    """The call's deadline passed."""


class Cancelled(NibError):
    """The call was cancelled by someone other than this stream's caller."""


_BY_CODE: dict[grpc.StatusCode, type[NibError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.CANCELLED: Cancelled,
}


def error_for(code: grpc.StatusCode, message: str) -> NibError:
    return _BY_CODE.get(code, NibError)(code, message)


def rpc_code(error: grpc.RpcError) -> grpc.StatusCode:
    """The status of a failed sync or asyncio call (both expose code())."""
    code = getattr(error, "code", None)
    result = code() if callable(code) else None
    return result if isinstance(result, grpc.StatusCode) else grpc.StatusCode.UNKNOWN


def from_rpc_error(error: grpc.RpcError) -> NibError:
    details = getattr(error, "details", None)
    message = details() if callable(details) else str(error)
    return error_for(rpc_code(error), message or "")


def from_code(code_value: int, message: str) -> NibError:
    """The error for a numeric status (google.rpc.Code numbering), as a session's Done carries."""
    code = next((c for c in grpc.StatusCode if c.value[0] == code_value), grpc.StatusCode.UNKNOWN)
    return error_for(code, message)
