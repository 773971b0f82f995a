"""Build and run the gRPC server: completion service, health and reflection."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from nib.engine.engine import Engine, EngineConfig
from nib.service.convert import Limits
from nib.service.errors import ErrorInterceptor
from nib.service.servicer import CompletionServicer
from nib.v1 import completion_pb2, completion_pb2_grpc

log = logging.getLogger("nib.service")

SERVICE_NAME = completion_pb2.DESCRIPTOR.services_by_name["CompletionService"].full_name
MAX_MESSAGE_BYTES = 4 * 1024 * 1024


def server_version() -> str:
    try:
        return version("nib")
    except PackageNotFoundError:
        return "0+unknown"


@dataclass(frozen=True)
class ServerConfig:
    engine: EngineConfig
    host: str = "127.0.0.1"
    port: int = 50051
    grace_s: float = 5.0


class NibServer:
    """A started server; `port` is the bound port (useful with port 0)."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.engine = Engine(config.engine)
        self.health = health.aio.HealthServicer()
        self.server = grpc.aio.server(
            interceptors=[ErrorInterceptor()],
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ],
        )
        limits = Limits(config.engine.max_tokens_limit, config.engine.default_max_tokens)
        completion_pb2_grpc.add_CompletionServiceServicer_to_server(
            CompletionServicer(self.engine, limits, server_version()), self.server
        )
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable_server_reflection(
            (
                SERVICE_NAME,
                health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                reflection.SERVICE_NAME,
            ),
            self.server,
        )
        self.port = self.server.add_insecure_port(f"{config.host}:{config.port}")
        self._watch: asyncio.Task[None] | None = None

    async def start(self) -> None:
        for name in ("", SERVICE_NAME):
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        self.engine.start()
        await self.server.start()
        log.info(
            "nib listening on %s:%d (model %s)",
            self.config.host,
            self.port,
            self.config.engine.model_dir,
        )
        self._watch = asyncio.create_task(self._report_ready())

    async def _report_ready(self) -> None:
        """SERVING once the engine has loaded and warmed up; stays NOT_SERVING if it failed."""
        while not await asyncio.to_thread(self.engine.wait_ready, 0.5):
            if self.engine.failure is not None or not self.engine.alive:
                log.error("engine failed; health stays NOT_SERVING: %s", self.engine.failure)
                return
        for name in ("", SERVICE_NAME):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        log.info("engine ready: health SERVING")

    async def stop(self) -> None:
        for name in ("", SERVICE_NAME):
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.server.stop(self.config.grace_s)
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        await asyncio.to_thread(self.engine.stop)


async def serve(config: ServerConfig) -> None:
    """Run until SIGINT/SIGTERM, then drain for the grace period and stop."""
    server = NibServer(config)
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("shutting down (grace %.1fs)", config.grace_s)
    await server.stop()


def default_engine_config(model: Path | None, **overrides: object) -> EngineConfig:
    from nib.engine.default_model import default_model_dir

    return EngineConfig(model_dir=model or default_model_dir(), **overrides)  # type: ignore[arg-type]
