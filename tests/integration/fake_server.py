"""A scripted CompletionService on loopback, for faults the real server cannot be made to show
on cue: UNAVAILABLE a given number of times, a failure after the first token, a stall past a
deadline, a TLS handshake, and a record of the metadata each call carried.

It is a test double of the wire contract only; the real server's behaviour is tested against
the real server (tests/integration/conftest.py).
"""

from __future__ import annotations

import datetime
import ipaddress
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from nib.v1 import completion_pb2 as pb
from nib.v1 import completion_pb2_grpc as pb_grpc


@dataclass
class Script:
    """What the fake does. Calls numbered from 1; calls up to `fail_first` are aborted."""

    fail_first: int = 0
    fail_code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE
    fail_message: str = "scripted failure"
    deltas: tuple[str, ...] = ("Hello", ", ", "world")
    stall_s: float = 0.0  # before the first delta
    fail_after_first_delta: bool = False


@dataclass
class Record:
    method: str
    metadata: dict[str, str]
    at: float = field(default_factory=time.monotonic)


class ScriptedServicer(pb_grpc.CompletionServiceServicer):  # type: ignore[misc]
    def __init__(self, script: Script) -> None:
        self.script = script
        self.records: list[Record] = []
        self._lock = threading.Lock()

    def _enter(self, method: str, context: grpc.ServicerContext) -> int:
        with self._lock:
            self.records.append(Record(method, dict(context.invocation_metadata())))
            return len(self.records)

    def _events(
        self, request: pb.CompleteRequest, context: grpc.ServicerContext
    ) -> Iterator[tuple[pb.Delta | None, pb.Done | None]]:
        s = self.script
        stall_until = time.monotonic() + s.stall_s
        while time.monotonic() < stall_until and context.is_active():
            time.sleep(0.01)
        for i, text in enumerate(s.deltas):
            yield pb.Delta(text=text, token_ids=[i]), None
            if s.fail_after_first_delta:
                context.abort(grpc.StatusCode.UNAVAILABLE, "went away after the first token")
        done = pb.Done(
            finish_reason=pb.FINISH_REASON_LENGTH,
            usage=pb.Usage(prompt_tokens=1, completion_tokens=len(s.deltas)),
        )
        yield None, done

    def Complete(
        self, request: pb.CompleteRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.CompleteResponse]:
        n = self._enter("Complete", context)
        if n <= self.script.fail_first:
            context.abort(self.script.fail_code, self.script.fail_message)
        for delta, done in self._events(request, context):
            yield pb.CompleteResponse(request_id=request.request_id, delta=delta, done=done)

    def Session(
        self, requests: Iterator[pb.SessionRequest], context: grpc.ServicerContext
    ) -> Iterator[pb.SessionResponse]:
        n = self._enter("Session", context)
        if n <= self.script.fail_first:
            context.abort(self.script.fail_code, self.script.fail_message)
        for message in requests:
            if message.WhichOneof("action") != "start":
                continue
            rid = message.start.request_id
            for delta, done in self._events(message.start, context):
                yield pb.SessionResponse(request_id=rid, delta=delta, done=done)

    def GetModelInfo(
        self, request: pb.GetModelInfoRequest, context: grpc.ServicerContext
    ) -> pb.GetModelInfoResponse:
        self._enter("GetModelInfo", context)
        return pb.GetModelInfoResponse(model="fake", server_version="fake")


@dataclass
class FakeServer:
    address: str
    servicer: ScriptedServicer
    server: grpc.Server

    def stop(self) -> None:
        self.server.stop(0).wait()


def start_fake(script: Script, tls: tuple[bytes, bytes] | None = None, port: int = 0) -> FakeServer:
    """Serve `script` on loopback (a free port unless given; a given one brings a server
    "back" where an earlier one stopped); with tls=(key_pem, cert_pem), over TLS."""
    servicer = ScriptedServicer(script)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    pb_grpc.add_CompletionServiceServicer_to_server(servicer, server)
    if tls is None:
        port = server.add_insecure_port(f"127.0.0.1:{port}")
    else:
        creds = grpc.ssl_server_credentials([tls])
        port = server.add_secure_port(f"127.0.0.1:{port}", creds)
    server.start()
    return FakeServer(f"127.0.0.1:{port}", servicer, server)


@dataclass(frozen=True)
class Pki:
    ca_file: Path
    key_pem: bytes
    cert_pem: bytes


def make_pki(out: Path, names: tuple[str, ...] = ("localhost",), ip: str | None = None) -> Pki:
    """A throwaway CA and a server certificate it signed, for `names` (and `ip`)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)

    def build(
        subject: str, issuer: x509.Name | None, key: ec.EllipticCurvePrivateKey
    ) -> x509.CertificateBuilder:
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
        return (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(issuer or name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
        )

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        build("nib test CA", None, ca_key)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in names]
    if ip is not None:
        sans.append(x509.IPAddress(ipaddress.ip_address(ip)))
    cert = (
        build(names[0], ca_cert.subject, key)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    ca_file = out / "ca.pem"
    ca_file.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return Pki(ca_file, key_pem, cert.public_bytes(serialization.Encoding.PEM))
