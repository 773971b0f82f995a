"""Build and run the gRPC server: completion service, health, reflection, metrics.

Lifecycle: health is NOT_SERVING until the engine reports ready (on a GPU, once
its graphs are captured), then SERVING; NOT_SERVING again for good if the
engine thread dies. stop() drains: health NOT_SERVING, new completions get
UNAVAILABLE, in-flight ones have `grace_s` to finish, then are cancelled (the
engine lets go within one step) and end with UNAVAILABLE.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from dataclasses import dataclass
from pathlib import Path

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from nib.engine.engine import Engine, EngineConfig
from nib.engine.hooks import EngineHooks, EngineState
from nib.engine.versions import nib_version
from nib.service.auth import ApiKeys, auth_interceptor
from nib.service.convert import Limits
from nib.service.errors import error_interceptor
from nib.service.faults import FaultPlan
from nib.service.ledger import Ledger
from nib.service.metrics import Metrics, MetricsServer
from nib.service.servicer import CompletionServicer
from nib.service.telemetry import Telemetry
from nib.service.tls import TlsConfig
from nib.v1 import completion_pb2, completion_pb2_grpc

log = structlog.get_logger("nib.service")

SERVICE_NAME = completion_pb2.DESCRIPTOR.services_by_name["CompletionService"].full_name
HEALTH_NAMES = ("", SERVICE_NAME)
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
# How long cancelled completions get to reach their end after the drain period
# (the engine stops within one decode step; this only bounds a stuck engine).
CANCEL_WAIT_S = 10.0


def server_version() -> str:
    return nib_version()


@dataclass(frozen=True)
class ServerConfig:
    engine: EngineConfig
    host: str = "127.0.0.1"
    port: int = 50051
    grace_s: float = 5.0
    metrics_host: str = "127.0.0.1"
    metrics_port: int | None = None  # None: no metrics endpoint; 0: any free port
    api_keys: ApiKeys | None = None
    tls: TlsConfig | None = None
    max_message_bytes: int = MAX_MESSAGE_BYTES
    max_concurrent_rpcs: int | None = 1024
    faults: FaultPlan | None = None
    telemetry_interval_s: float = 5.0  # NVML sampling and fragmentation watch (0: off)
    fragmentation_threshold: float = 0.3  # warn above this share of unused reserved memory


class NibServer:
    """A server; `port` is the bound port (useful with port 0)."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self._loop: asyncio.AbstractEventLoop | None = None
        self._states: asyncio.Queue[EngineState] = asyncio.Queue()
        hooks = (
            config.faults.hooks(self._on_engine_state)
            if config.faults is not None
            else EngineHooks(on_state=self._on_engine_state)
        )
        self.engine = Engine(config.engine, hooks)
        self.telemetry = Telemetry(
            self.engine, config.telemetry_interval_s, config.fragmentation_threshold
        )
        self.metrics = Metrics(self.engine, telemetry=self.telemetry)
        limits = Limits(
            config.engine.max_tokens_limit,
            config.engine.default_max_tokens,
            self.engine.model_config.vocab_size,
        )
        self.ledger = Ledger(self.engine, limits, self.metrics)
        self.health = health.aio.HealthServicer()
        self.server = grpc.aio.server(
            interceptors=[
                auth_interceptor(config.api_keys, self._auth_failed),
                error_interceptor(),
            ],
            options=[
                ("grpc.max_receive_message_length", config.max_message_bytes),
                ("grpc.max_send_message_length", config.max_message_bytes),
                # Find peers that vanished without closing their connection.
                ("grpc.keepalive_time_ms", 30_000),
                ("grpc.keepalive_timeout_ms", 10_000),
                ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
            ],
            maximum_concurrent_rpcs=config.max_concurrent_rpcs,
        )
        completion_pb2_grpc.add_CompletionServiceServicer_to_server(
            CompletionServicer(self.engine, self.ledger, server_version(), self.telemetry),
            self.server,
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
        address = f"{config.host}:{config.port}"
        if config.tls is not None:
            self.port = self.server.add_secure_port(address, config.tls.credentials())
        else:
            self.port = self.server.add_insecure_port(address)
        self.metrics_server: MetricsServer | None = None
        self._follow: asyncio.Task[None] | None = None
        self._stopped = False

    def _auth_failed(self, reason: str) -> None:
        self.metrics.auth_failures.labels(reason).inc()

    def _on_engine_state(self, state: EngineState) -> None:
        """Engine thread -> event loop."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._states.put_nowait, state)

    async def _set_health(self, serving: bool) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in HEALTH_NAMES:
            await self.health.set(name, status)

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        await self._set_health(False)
        self.engine.start()
        self.telemetry.start()
        await self.server.start()
        if self.config.metrics_port is not None:
            self.metrics_server = MetricsServer(
                self.metrics, self.config.metrics_host, self.config.metrics_port
            )
        log.info(
            "listening",
            address=f"{self.config.host}:{self.port}",
            tls=self.config.tls is not None,
            api_keys=self.config.api_keys is not None,
            tenants=sorted(self.config.api_keys.tenants) if self.config.api_keys else None,
            metrics_port=self.metrics_server.port if self.metrics_server else None,
            model=str(self.config.engine.model_dir),
        )
        self._follow = asyncio.create_task(self._follow_engine())

    async def _follow_engine(self) -> None:
        """Health follows the engine: SERVING when ready, NOT_SERVING for good when it dies.
        States come from the engine's hook; the liveness poll covers a thread that ended
        without telling."""
        while True:
            try:
                async with asyncio.timeout(1.0):
                    state = await self._states.get()
            except TimeoutError:
                if self.engine.alive or self._stopped:
                    continue
                state = EngineState.FAILED
            if state is EngineState.READY:
                await self._set_health(True)
                log.info("engine ready: health SERVING")
            else:
                await self._set_health(False)
                if state is EngineState.FAILED:
                    log.error("engine failed: health NOT_SERVING", error=str(self.engine.failure))
                return

    async def stop(
        self, grace_s: float | None = None, skip_grace: asyncio.Event | None = None
    ) -> None:
        """Drain, then stop. `skip_grace`, once set, ends the drain period early."""
        if self._stopped:
            return
        self._stopped = True
        grace = self.config.grace_s if grace_s is None else grace_s
        await self.health.enter_graceful_shutdown()
        self.ledger.start_draining()
        inflight = self.ledger.inflight
        log.info("draining", inflight=inflight, grace_s=grace)
        drained = await self._wait_drained(grace, skip_grace)
        if not drained:
            cancelled = self.ledger.cancel_all("shutdown")
            log.warning("drain period over: cancelling", cancelled=cancelled)
            if not await self.ledger.wait_idle(CANCEL_WAIT_S):
                log.error("completions still running after cancel", inflight=self.ledger.inflight)
        # Sessions end as soon as they are idle; what is left (health watches,
        # half-open sessions) gets a second to finish, then is cancelled.
        await self.server.stop(1.0)
        if self._follow is not None:
            self._follow.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._follow
        await asyncio.to_thread(self.engine.stop)
        await asyncio.to_thread(self.telemetry.stop)
        self.ledger.close()
        if self.metrics_server is not None:
            self.metrics_server.close()
        log.info("stopped")

    async def _wait_drained(self, grace: float, skip: asyncio.Event | None) -> bool:
        if skip is None:
            return await self.ledger.wait_idle(grace)
        idle = asyncio.create_task(self.ledger.wait_idle(grace))
        skipped = asyncio.create_task(skip.wait())
        await asyncio.wait({idle, skipped}, return_when=asyncio.FIRST_COMPLETED)
        skipped.cancel()
        if not idle.done():
            idle.cancel()
            return False
        return idle.result()


async def serve(config: ServerConfig) -> None:
    """Run until SIGINT/SIGTERM, then drain for the grace period and stop; a second
    signal cuts the drain short."""
    server = NibServer(config)
    await server.start()
    stop, hurry = asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        (hurry if stop.is_set() else stop).set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    await stop.wait()
    log.info("signal received: shutting down", grace_s=config.grace_s)
    await server.stop(skip_grace=hurry)


def default_engine_config(model: Path | None, **overrides: object) -> EngineConfig:
    from nib.engine.default_model import default_model_dir

    return EngineConfig(model_dir=model or default_model_dir(), **overrides)  # type: ignore[arg-type]
