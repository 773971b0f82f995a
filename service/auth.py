"""Optional API keys: `authorization: Bearer <key>` metadata, checked in an interceptor.

The key file has one `tenant:key` pair per line; blank lines and lines starting
with `#` are ignored. Tenant names are short identifiers (they become a metric
label and a log field); a tenant may have several keys (rotation). Keys are
kept only as SHA-256 digests and compared in constant time; they are never
logged, and errors about the file name the line, not the key.

Health and reflection stay open without a key: load balancers and orchestrators
probe health without credentials, and reflection describes only the public
contract. Every CompletionService method needs a key when keys are configured.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

import grpc
import structlog

from nib.service.interceptors import GuardInterceptor

ANONYMOUS = "anonymous"  # the tenant of every call when no keys are configured
TENANT_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
KEY_PATTERN = re.compile(r"[!-~]{16,256}")  # visible ASCII: it travels in an HTTP/2 header
OPEN_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")

tenant_var: ContextVar[str] = ContextVar("nib_tenant", default=ANONYMOUS)


def current_tenant() -> str:
    return tenant_var.get()


class KeyFileError(ValueError):
    """The API key file is malformed; the message names the line, never the key."""


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


@dataclass(frozen=True)
class ApiKeys:
    by_digest: Mapping[bytes, str]  # sha256(key) -> tenant

    @classmethod
    def parse(cls, text: str, source: str = "API key file") -> ApiKeys:
        by_digest: dict[bytes, str] = {}
        for number, raw in enumerate(text.splitlines(), start=1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            tenant, sep, key = line.partition(":")
            tenant, key = tenant.strip(), key.strip()
            where = f"{source} line {number}"
            if not sep:
                raise KeyFileError(f"{where}: expected tenant:key")
            if not TENANT_PATTERN.fullmatch(tenant):
                raise KeyFileError(
                    f"{where}: tenant must be 1-64 letters, digits, '_', '.' or '-' "
                    "and start with a letter or digit"
                )
            if not KEY_PATTERN.fullmatch(key):
                raise KeyFileError(f"{where}: key must be 16-256 visible ASCII characters")
            digest = _digest(key)
            if digest in by_digest:
                raise KeyFileError(f"{where}: this key is already listed")
            by_digest[digest] = tenant
        if not by_digest:
            raise KeyFileError(f"{source}: no keys")
        return cls(by_digest)

    @classmethod
    def from_file(cls, path: Path) -> ApiKeys:
        return cls.parse(path.read_text(), str(path))

    @property
    def tenants(self) -> frozenset[str]:
        return frozenset(self.by_digest.values())

    def tenant_of(self, key: str) -> str | None:
        """The key's tenant, or None; looks at every entry so timing says nothing."""
        digest = _digest(key)
        found = None
        for known, tenant in self.by_digest.items():
            if hmac.compare_digest(known, digest):
                found = tenant
        return found


def bearer_token(metadata: object) -> str | None:
    """The token of an `authorization: Bearer <token>` metadata entry, if any."""
    for key, value in metadata or ():  # type: ignore[attr-defined]
        if key == "authorization" and isinstance(value, str):
            scheme, _, token = value.partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
    return None


def is_open(method: str) -> bool:
    return method.startswith(OPEN_PREFIXES)


def auth_interceptor(
    keys: ApiKeys | None, on_failure: Callable[[str], None] = lambda reason: None
) -> GuardInterceptor:
    """Checks the key (if keys are configured) and binds the caller's tenant for the call:
    in `tenant_var` and in the structlog context, so that every log line of the call
    carries it. `on_failure(reason)` is told of each rejection ("missing" or "invalid")."""

    @asynccontextmanager
    async def guard(
        details: grpc.HandlerCallDetails, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[None]:
        tenant = ANONYMOUS
        if keys is not None:
            token = bearer_token(details.invocation_metadata)
            if token is None:
                on_failure("missing")
                await context.abort(
                    grpc.StatusCode.UNAUTHENTICATED,
                    "missing API key: send metadata 'authorization: Bearer <key>'",
                )
            found = keys.tenant_of(token or "")
            if found is None:
                on_failure("invalid")
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, "invalid API key")
            tenant = found or ANONYMOUS
        # Each RPC runs in its own task, hence its own context: no reset needed (a
        # reset could run in another context when the stream is finalised).
        tenant_var.set(tenant)
        structlog.contextvars.bind_contextvars(tenant=tenant)
        yield

    return GuardInterceptor(guard, applies=lambda method: not is_open(method))
