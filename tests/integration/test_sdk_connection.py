"""Connection options, retries and typed errors, against a scripted server on loopback."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from nib.sdk import (
    NO_RETRY,
    AsyncClient,
    Client,
    DeadlineExceeded,
    InvalidArgument,
    NibError,
    PermissionDenied,
    ResourceExhausted,
    RetryPolicy,
    Unauthenticated,
    Unavailable,
)

from .fake_server import FakeServer, Script, make_pki, start_fake

FAST_RETRY = RetryPolicy(max_attempts=4, initial_backoff_s=0.05, max_backoff_s=0.2)


@pytest.fixture
def fake() -> Iterator[FakeServer]:
    server = start_fake(Script())
    yield server
    server.stop()


def test_unavailable_is_retried_with_backoff_before_the_first_token(fake: FakeServer) -> None:
    fake.servicer.script.fail_first = 2
    with Client(fake.address, retry=FAST_RETRY) as client:
        stream = client.complete("x")
        assert "".join(stream) == "Hello, world"
    assert stream.attempts == 3 and len(fake.servicer.records) == 3
    gaps = [
        b.at - a.at for a, b in zip(fake.servicer.records, fake.servicer.records[1:], strict=False)
    ]
    # Attempt n waits between half and all of min(0.2, 0.05 * 2**(n-1)).
    assert gaps[0] >= 0.025 and gaps[1] >= 0.05, gaps


def test_retries_stop_after_max_attempts(fake: FakeServer) -> None:
    fake.servicer.script.fail_first = 100
    with (
        Client(fake.address, retry=FAST_RETRY) as client,
        pytest.raises(Unavailable, match="scripted failure") as info,
    ):
        list(client.complete("x"))
    assert info.value.message == "scripted failure"
    assert len(fake.servicer.records) == FAST_RETRY.max_attempts


def test_no_retry_once_a_token_arrived(fake: FakeServer) -> None:
    fake.servicer.script.fail_after_first_delta = True
    with Client(fake.address, retry=FAST_RETRY) as client:
        stream = client.complete("x")
        received = []
        with pytest.raises(Unavailable, match="after the first token"):
            for text in stream:
                received.append(text)
    assert received == ["Hello"] and stream.text == "Hello"
    assert stream.attempts == 1 and len(fake.servicer.records) == 1


def test_no_retry_policy_fails_at_once(fake: FakeServer) -> None:
    fake.servicer.script.fail_first = 1
    with Client(fake.address, retry=NO_RETRY) as client, pytest.raises(Unavailable):
        list(client.complete("x"))
    assert len(fake.servicer.records) == 1


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        (grpc.StatusCode.INVALID_ARGUMENT, InvalidArgument),
        (grpc.StatusCode.UNAUTHENTICATED, Unauthenticated),
        (grpc.StatusCode.PERMISSION_DENIED, PermissionDenied),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, ResourceExhausted),
        (grpc.StatusCode.DEADLINE_EXCEEDED, DeadlineExceeded),
        (grpc.StatusCode.INTERNAL, NibError),
    ],
)
def test_each_status_is_its_own_error_with_the_servers_message_and_is_not_retried(
    fake: FakeServer, code: grpc.StatusCode, kind: type[NibError]
) -> None:
    fake.servicer.script.fail_first = 1
    fake.servicer.script.fail_code = code
    fake.servicer.script.fail_message = "max_tokens: is 9; must be at most 8"
    with Client(fake.address, retry=FAST_RETRY) as client, pytest.raises(kind) as info:
        list(client.complete("x"))
    assert type(info.value) is kind
    assert info.value.code == code and info.value.message == "max_tokens: is 9; must be at most 8"
    assert len(fake.servicer.records) == 1


async def test_async_client_retries_and_raises_the_same_errors(fake: FakeServer) -> None:
    fake.servicer.script.fail_first = 2
    async with AsyncClient(fake.address, retry=FAST_RETRY) as client:
        stream = client.complete("x")
        assert [t async for t in stream] == ["Hello", ", ", "world"]
        assert stream.attempts == 3
        fake.servicer.script.fail_first = 100
        with pytest.raises(Unavailable, match="scripted failure"):
            await client.complete("x").result()


def test_session_start_is_retried_before_the_first_token(fake: FakeServer) -> None:
    fake.servicer.script.fail_first = 1
    with Client(fake.address, retry=FAST_RETRY) as client, client.session() as session:
        stream = session.complete("x")
        assert stream.result().text == "Hello, world"
    assert stream.attempts == 2
    assert [r.method for r in fake.servicer.records] == ["Session", "Session"]


async def test_async_session_start_is_retried_before_the_first_token(fake: FakeServer) -> None:
    fake.servicer.script.fail_first = 1
    async with AsyncClient(fake.address, retry=FAST_RETRY) as client, client.session() as session:
        stream = session.complete("x")
        assert (await stream.result()).text == "Hello, world"
    assert stream.attempts == 2


def test_api_key_travels_as_bearer_metadata_on_every_rpc(fake: FakeServer) -> None:
    with Client(fake.address, api_key="k-0123456789abcdef") as client:
        list(client.complete("x"))
        client.session().complete("x").result()
        client.model_info()
    assert [r.method for r in fake.servicer.records] == ["Complete", "Session", "GetModelInfo"]
    for record in fake.servicer.records:
        assert record.metadata.get("authorization") == "Bearer k-0123456789abcdef"


async def test_async_api_key_travels_as_bearer_metadata(fake: FakeServer) -> None:
    async with AsyncClient(fake.address, api_key="k-0123456789abcdef") as client:
        await client.complete("x").result()
        await client.session().complete("x").result()
    for record in fake.servicer.records:
        assert record.metadata.get("authorization") == "Bearer k-0123456789abcdef"


def test_without_api_key_no_authorization_is_sent(fake: FakeServer) -> None:
    with Client(fake.address) as client:
        list(client.complete("x"))
    assert "authorization" not in fake.servicer.records[0].metadata


def test_per_call_deadline_and_client_default(fake: FakeServer) -> None:
    fake.servicer.script.stall_s = 5.0
    with Client(fake.address, timeout=0.3) as client:
        start = time.monotonic()
        with pytest.raises(DeadlineExceeded):
            list(client.complete("x"))
        assert time.monotonic() - start < 2.0
        start = time.monotonic()
        with pytest.raises(DeadlineExceeded):
            list(client.complete("x", timeout=0.1))
        assert time.monotonic() - start < 0.3 + 1.0
        with pytest.raises(DeadlineExceeded, match="deadline"):
            client.session().complete("x", timeout=0.2).result()


async def test_async_deadline(fake: FakeServer) -> None:
    fake.servicer.script.stall_s = 5.0
    async with AsyncClient(fake.address) as client:
        with pytest.raises(DeadlineExceeded):
            await client.complete("x", timeout=0.2).result()
        with pytest.raises(DeadlineExceeded):
            await client.session().complete("x", timeout=0.2).result()


def test_one_channel_serves_every_call(fake: FakeServer, monkeypatch: pytest.MonkeyPatch) -> None:
    opened = []
    real = grpc.insecure_channel

    def counting(*args: object, **kwargs: object) -> grpc.Channel:
        opened.append(args)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(grpc, "insecure_channel", counting)
    with Client(fake.address) as client:
        for _ in range(3):
            list(client.complete("x"))
        client.session().complete("x").result()
        client.model_info()
    assert len(opened) == 1


def test_tls_with_a_ca_file(tmp_path: Path) -> None:
    pki = make_pki(tmp_path, names=("localhost",), ip="127.0.0.1")
    server = start_fake(Script(), tls=(pki.key_pem, pki.cert_pem))
    try:
        with Client(server.address, ca_file=pki.ca_file) as client:
            assert "".join(client.complete("x")) == "Hello, world"
        # A client that does not trust the CA is refused, and says so.
        with Client(server.address, tls=True, retry=NO_RETRY) as client, pytest.raises(Unavailable):
            list(client.complete("x"))
        # Plain text to a TLS port gets nowhere either.
        with (
            Client(server.address, retry=NO_RETRY, timeout=5) as client,
            pytest.raises(Unavailable),
        ):
            list(client.complete("x"))
    finally:
        server.stop()


def test_tls_with_a_certificate_for_another_name(tmp_path: Path) -> None:
    pki = make_pki(tmp_path, names=("nib.internal",))
    server = start_fake(Script(), tls=(pki.key_pem, pki.cert_pem))
    try:
        with (
            Client(server.address, ca_file=pki.ca_file, retry=NO_RETRY) as client,
            pytest.raises(Unavailable),
        ):
            list(client.complete("x"))  # 127.0.0.1 is not nib.internal
        with Client(server.address, ca_file=pki.ca_file, server_name="nib.internal") as client:
            assert "".join(client.complete("x")) == "Hello, world"
    finally:
        server.stop()


async def test_async_tls(tmp_path: Path) -> None:
    pki = make_pki(tmp_path, names=("localhost",), ip="127.0.0.1")
    server = start_fake(Script(), tls=(pki.key_pem, pki.cert_pem))
    try:
        async with AsyncClient(server.address, ca_file=pki.ca_file) as client:
            assert (await client.complete("x").result()).text == "Hello, world"
    finally:
        await asyncio.to_thread(server.stop)
