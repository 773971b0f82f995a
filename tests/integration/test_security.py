"""API keys (interceptor, tenants in logs and metrics, keys never logged) and TLS."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from nib.sdk import NibError
from nib.v1 import completion_pb2 as pb
from nib.v1 import completion_pb2_grpc as pb_grpc

from .certs import Pki, make_pki
from .conftest import ServerProcess, grpcurl, json_stream, start_server, stop_server, wait_for
from .metrics_util import parse, value

ACME_KEY = "acme-0123456789abcdef"
GLOBEX_KEY = "globex-fedcba9876543210"


class TlsChannel:
    """A TLS channel with the `health()` start_server polls."""

    def __init__(self, address: str, pki: Pki, client_cert: bool = False) -> None:
        creds = grpc.ssl_channel_credentials(
            root_certificates=pki.ca.read_bytes(),
            private_key=pki.client_key.read_bytes() if client_cert else None,
            certificate_chain=pki.client_cert.read_bytes() if client_cert else None,
        )
        self.channel = grpc.secure_channel(address, creds)

    def health(self, timeout: float = 5.0) -> str:
        stub = health_pb2_grpc.HealthStub(self.channel)
        try:
            r = stub.Check(health_pb2.HealthCheckRequest(), timeout=timeout)
        except grpc.RpcError as exc:
            raise NibError(exc.code(), exc.details() or "") from None
        name: str = health_pb2.HealthCheckResponse.ServingStatus.Name(r.status)
        return name

    def __enter__(self) -> TlsChannel:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.channel.close()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def secure_server(
    random_model_dir: Path, pki: Pki, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    folder = tmp_path_factory.mktemp("secure")
    keys = folder / "keys.txt"
    keys.write_text(f"# tenant:key\nacme:{ACME_KEY}\nglobex:{GLOBEX_KEY}\n")
    proc = start_server(
        random_model_dir,
        folder / "server.log",
        "--api-key-file",
        str(keys),
        "--log-level",
        "DEBUG",
        "--tls-cert",
        str(pki.server_cert),
        "--tls-key",
        str(pki.server_key),
        metrics=True,
        health_client=lambda address: TlsChannel(address, pki),
    )
    yield proc
    stop_server(proc)


def complete(channel: grpc.Channel, key: str | None, request_id: str) -> list[pb.CompleteResponse]:
    stub = pb_grpc.CompletionServiceStub(channel)
    metadata = (("authorization", f"Bearer {key}"),) if key is not None else None
    request = pb.CompleteRequest(prompt="x", max_tokens=3, request_id=request_id)
    return list(stub.Complete(request, timeout=30, metadata=metadata))


def test_api_keys_and_tenants(secure_server: ServerProcess, pki: Pki) -> None:
    with TlsChannel(secure_server.address, pki) as tls:
        for key, message in (
            (None, "missing API key"),
            ("wrong-key-0123456789", "invalid API key"),
        ):
            with pytest.raises(grpc.RpcError) as info:
                complete(tls.channel, key, "denied")
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert info.value.details().startswith(message)
        with pytest.raises(grpc.RpcError) as info:
            pb_grpc.CompletionServiceStub(tls.channel).GetModelInfo(pb.GetModelInfoRequest())
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert complete(tls.channel, ACME_KEY, "by-acme")[-1].done.usage.completion_tokens == 3
        assert complete(tls.channel, GLOBEX_KEY, "by-globex")[-1].HasField("done")
        # Health stays open without a key.
        assert tls.health() == "SERVING"

    assert secure_server.request_event("by-acme")["tenant"] == "acme"
    assert secure_server.request_event("by-globex")["tenant"] == "globex"
    admitted = [e for e in secure_server.events() if e.get("event") == "admitted"]
    assert {e["tenant"] for e in admitted} == {"acme", "globex"}
    wait_for(
        lambda: value(parse(secure_server.metrics()), "nib_inflight_requests") == 0, 10, "idle"
    )
    samples = parse(secure_server.metrics())
    ok = "nib_requests_total"
    assert value(samples, ok, method="Complete", tenant="acme", code="OK") == 1
    assert value(samples, ok, method="Complete", tenant="globex", code="OK") == 1
    assert value(samples, "nib_auth_failures_total", reason="missing") == 2
    assert value(samples, "nib_auth_failures_total", reason="invalid") == 1
    log = secure_server.output()
    for key in (ACME_KEY, GLOBEX_KEY, "wrong-key-0123456789"):
        assert key not in log


def test_grpcurl_over_tls_with_a_key(secure_server: ServerProcess, pki: Pki) -> None:
    tls = ("-cacert", str(pki.ca))
    listed = grpcurl(*tls, secure_server.address, "list")  # reflection needs no key
    assert listed.returncode == 0, listed.stderr
    assert "nib.v1.CompletionService" in listed.stdout.split()
    body = json.dumps({"prompt": "def", "max_tokens": 2})
    out = grpcurl(
        *tls,
        "-H",
        f"authorization: Bearer {ACME_KEY}",
        "-d",
        body,
        secure_server.address,
        "nib.v1.CompletionService/Complete",
    )
    assert out.returncode == 0, out.stderr
    assert json_stream(out.stdout)[-1]["done"]["usage"]["completion_tokens"] == 2
    denied = grpcurl(*tls, "-d", body, secure_server.address, "nib.v1.CompletionService/Complete")
    assert denied.returncode != 0 and "Code: Unauthenticated" in denied.stderr
    plain = grpcurl("-plaintext", "-max-time", "5", secure_server.address, "list")
    assert plain.returncode != 0  # a TLS server does not speak plaintext


def test_mutual_tls(random_model_dir: Path, pki: Pki, tmp_path: Path) -> None:
    server = start_server(
        random_model_dir,
        tmp_path / "server.log",
        "--tls-cert",
        str(pki.server_cert),
        "--tls-key",
        str(pki.server_key),
        "--tls-client-ca",
        str(pki.ca),
        health_client=lambda address: TlsChannel(address, pki, client_cert=True),
    )
    try:
        with TlsChannel(server.address, pki, client_cert=True) as good:
            assert complete(good.channel, None, "mtls")[-1].HasField("done")
        with TlsChannel(server.address, pki) as anonymous, pytest.raises(NibError) as info:
            anonymous.health(timeout=5)
        assert info.value.code == grpc.StatusCode.UNAVAILABLE
    finally:
        stop_server(server)
