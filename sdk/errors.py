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


# grpcio's asyncio client (grpc/grpc#36066, still open; seen with grpcio 1.85): when the server
# ends a stream-stream call while a client write is in flight, the failed write overwrites
# the server's status with this one, so the caller loses the server's code and words.
_LOST_DETAILS = "Internal error from Core"
_LOST_DEBUG = "execute_batch"


def status_lost_to_a_write(error: grpc.RpcError) -> grpc.RpcError:
    """The error to act on for an asyncio stream-stream call that failed.

    Where grpcio replaced the server's status with INTERNAL because a write raced the
    call's end, the stream did end under the client, for a reason it cannot read: that
    is UNAVAILABLE (retried like a lost connection while nothing was received; a
    lasting refusal shows its own status on the next attempt). Any other error is
    returned as it is."""
    if not (
        isinstance(error, grpc.aio.AioRpcError)
        and error.code() == grpc.StatusCode.INTERNAL
        and error.details() == _LOST_DETAILS
        and _LOST_DEBUG in (error.debug_error_string() or "")
    ):
        return error
    return grpc.aio.AioRpcError(
        grpc.StatusCode.UNAVAILABLE,
        grpc.aio.Metadata(),
        grpc.aio.Metadata(),
        details="the server ended the stream while a message was being sent, and grpcio "
        "lost its status (grpc/grpc#36066)",
        debug_error_string=error.debug_error_string(),
    )
