"""Server TLS credentials from PEM files (`nib serve --tls-cert/--tls-key`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc


@dataclass(frozen=True)
class TlsConfig:
    cert: Path  # PEM certificate chain
    key: Path  # PEM private key
    client_ca: Path | None = None  # when set, clients must present a certificate it signed

    def credentials(self) -> grpc.ServerCredentials:
        chain = self.cert.read_bytes()
        key = self.key.read_bytes()
        root = self.client_ca.read_bytes() if self.client_ca is not None else None
        return grpc.ssl_server_credentials(
            [(key, chain)], root_certificates=root, require_client_auth=root is not None
        )
