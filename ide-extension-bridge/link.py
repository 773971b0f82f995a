"""The bridge's link to the nib server: one asyncio client and one session, what the
model allows, and whether the server can be reached (told to the user once per change)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from lsprotocol import types

from nib.bridge.context import TokenRatio
from nib.bridge.settings import BridgeSettings
from nib.sdk import AsyncClient, AsyncSession, NibError, RetryPolicy

log = logging.getLogger("nib.bridge")

# What the bridge assumes until the server has said (GetModelInfo).
DEFAULT_CONTEXT_LENGTH = 2048
# An editor wants an answer now or not at all: one quick retry, then report.
RETRY = RetryPolicy(max_attempts=2, initial_backoff_s=0.05, max_backoff_s=0.1)
_CONNECTION_FIELDS = ("address", "api_key", "tls", "ca_file")

Notify = Callable[[types.MessageType, str], None]


class ServerLink:
    def __init__(self, settings: BridgeSettings, notify: Notify) -> None:
        self.settings = settings
        self._notify = notify
        self._client: AsyncClient | None = None
        self._session: AsyncSession | None = None
        self.context_length: int | None = None
        self.model: str | None = None
        self.reachable: bool | None = None  # None until the first answer or failure
        self.ratio = TokenRatio()

    def session(self) -> AsyncSession:
        if self._session is None:
            s = self.settings
            self._client = AsyncClient(
                s.address, tls=s.tls, ca_file=s.ca_file, api_key=s.api_key, retry=RETRY
            )
            self._session = self._client.session()
        return self._session

    async def reconfigure(self, settings: BridgeSettings) -> None:
        """New settings; a new address or credentials mean a new connection."""
        old, self.settings = self.settings, settings
        if any(getattr(old, f) != getattr(settings, f) for f in _CONNECTION_FIELDS):
            await self.close()
            self.context_length, self.model, self.reachable = None, None, None
            self.ratio = TokenRatio()

    async def model_context(self) -> int:
        """The model's context length, asked once per connection."""
        if self.context_length is None:
            self.session()
            assert self._client is not None
            info = await self._client.model_info(timeout=self.settings.timeout_s)
            self.context_length, self.model = info.context_length, info.model
            self.connected()
        return self.context_length

    async def check(self) -> None:
        """Ask the server once (at start-up) so that an unreachable one is reported early."""
        try:
            await self.model_context()
        except NibError as exc:
            self.failed(exc)

    def connected(self) -> None:
        if self.reachable is False:
            self._notify(
                types.MessageType.Info, f"nib: connected to {self.settings.address} again."
            )
        self.reachable = True

    def failed(self, exc: NibError) -> None:
        """Report a failure to reach or use the server, once until it changes."""
        code = exc.code.name
        if code in ("UNAUTHENTICATED", "PERMISSION_DENIED"):
            message = (
                f"nib: the server at {self.settings.address} refused the API key ({exc.message})."
            )
            kind = types.MessageType.Error
        elif code == "UNAVAILABLE":
            message = (
                f"nib: cannot reach the completion server at {self.settings.address} "
                f"({exc.message}). Completions resume when it is back."
            )
            kind = types.MessageType.Warning
        else:
            log.warning("completion failed: %s", exc)
            return
        log.warning("%s", message)
        if self.reachable is not False:
            self._notify(kind, message)
        self.reachable = False

    async def close(self) -> None:
        session, client = self._session, self._client
        self._session, self._client = None, None
        if session is not None:
            await session.aclose()
        if client is not None:
            await client.close()
