"""How a client reaches the server: address, TLS, API key, deadline, keepalive, retries.

One ConnectionOptions makes one channel (sync or asyncio) that the client
reuses for every call; the API key travels as call metadata
(`authorization: Bearer <key>`) on every call.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from nib.sdk.retry import RetryPolicy

DEFAULT_ADDRESS = "127.0.0.1:50051"
# Names the caller's editing session: the server keys its prompt-prefix cache by it and a
# load balancer in front of several replicas (deploy/envoy) hashes it to pick the replica.
SESSION_ID_HEADER = "nib-session-id"
# The server's own limit (service/server.py); a larger completion cannot happen.
MAX_MESSAGE_BYTES = 4 * 1024 * 1024


def system_root_certificates() -> bytes | None:
    """The operating system's CA bundle (OpenSSL's default file, honouring SSL_CERT_FILE).

    None when there is none, in which case gRPC uses the roots it ships with.
    """
    paths = ssl.get_default_verify_paths()
    for candidate in (paths.cafile, paths.openssl_cafile):
        if candidate and Path(candidate).is_file():
            return Path(candidate).read_bytes()
    return None


@dataclass(frozen=True)
class ConnectionOptions:
    """Everything about reaching one server. All durations are in seconds."""

    address: str = DEFAULT_ADDRESS
    # TLS: on with tls=True (system roots) or when ca_file is given (that CA only).
    tls: bool = False
    ca_file: str | Path | None = None
    # The name the server's certificate must carry, when it differs from the
    # host in `address` (e.g. connecting by IP to a certificate for a name).
    server_name: str | None = None
    api_key: str | None = None
    # Default deadline of each call; a call's own `timeout` overrides it.
    timeout: float | None = None
    # Send HTTP/2 pings every keepalive_s while calls are open, so a dead
    # connection (a silently dropped NAT entry) is noticed; None: no pings.
    # The server must allow pings this often (see the README).
    keepalive_s: float | None = None
    keepalive_timeout_s: float = 20.0
    # Longest wait between attempts to reconnect to a server that went away. gRPC's
    # default grows to 120 s; a completion client wants its server back within seconds.
    max_reconnect_backoff_s: float = 2.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)

    def __post_init__(self) -> None:
        if not self.address:
            raise ValueError("address must be host:port")
        if self.timeout is not None and self.timeout <= 0:
            raise ValueError(f"timeout is {self.timeout}; must be positive")
        if self.max_reconnect_backoff_s <= 0:
            raise ValueError(
                f"max_reconnect_backoff_s is {self.max_reconnect_backoff_s}; must be positive"
            )
        if self.keepalive_s is not None and self.keepalive_s <= 0:
            raise ValueError(f"keepalive_s is {self.keepalive_s}; must be positive")
        if self.api_key is not None and not self.api_key.isprintable():
            raise ValueError("api_key must be printable text")

    @property
    def secure(self) -> bool:
        return self.tls or self.ca_file is not None

    def credentials(self) -> grpc.ChannelCredentials:
        roots = (
            Path(self.ca_file).read_bytes()
            if self.ca_file is not None
            else system_root_certificates()
        )
        return grpc.ssl_channel_credentials(root_certificates=roots)

    def channel_options(self) -> list[tuple[str, int | str]]:
        options: list[tuple[str, int | str]] = [
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            # Retries are ours (only before the first token); gRPC's own
            # transparent retries would hide the attempts.
            ("grpc.enable_retries", 0),
            (
                "grpc.initial_reconnect_backoff_ms",
                int(min(1.0, self.max_reconnect_backoff_s) * 1000),
            ),
            ("grpc.max_reconnect_backoff_ms", int(self.max_reconnect_backoff_s * 1000)),
        ]
        if self.keepalive_s is not None:
            options += [
                ("grpc.keepalive_time_ms", int(self.keepalive_s * 1000)),
                ("grpc.keepalive_timeout_ms", int(self.keepalive_timeout_s * 1000)),
                ("grpc.keepalive_permit_without_calls", 0),
                ("grpc.http2.max_pings_without_data", 0),
            ]
        if self.server_name is not None:
            options.append(("grpc.ssl_target_name_override", self.server_name))
        return options

    def metadata(self, session_id: str | None = None) -> tuple[tuple[str, str], ...]:
        """Call metadata: the API key, and the editing session's id when there is one."""
        items: tuple[tuple[str, str], ...] = ()
        if self.api_key is not None:
            items += (("authorization", f"Bearer {self.api_key}"),)
        if session_id:
            items += ((SESSION_ID_HEADER, session_id),)
        return items

    def deadline(self, timeout: float | None) -> float | None:
        """The timeout of one call: its own, else the default."""
        return timeout if timeout is not None else self.timeout


# grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, read by the synchronous
# channel itself: a server-streaming call (Complete) is then driven by the thread that
# iterates it. By default every call that finds no other call open starts a "channel spin
# thread", which takes each response off the completion queue and wakes the iterating
# thread: a thread start per call and one thread hand-off more for every token (about
# 0.1-0.3 ms of the time to first token on loopback, bench/wire_trace.py). Spelled out, not
# imported, so that a grpcio without the experimental module still imports the SDK (an
# option it does not know is ignored); tests/integration/test_first_token.py checks it acts.
# A bidirectional call (Session) keeps its spin thread whatever the option says.
SINGLE_THREADED_STREAMS = ("SingleThreadedUnaryStream", 1)


def open_channel(options: ConnectionOptions) -> grpc.Channel:
    channel_options = [*options.channel_options(), SINGLE_THREADED_STREAMS]
    if options.secure:
        return grpc.secure_channel(options.address, options.credentials(), options=channel_options)
    return grpc.insecure_channel(options.address, options=channel_options)


def open_aio_channel(options: ConnectionOptions) -> grpc.aio.Channel:
    """An asyncio channel; call it inside the event loop that will use it."""
    if options.secure:
        return grpc.aio.secure_channel(
            options.address, options.credentials(), options=options.channel_options()
        )
    return grpc.aio.insecure_channel(options.address, options=options.channel_options())
