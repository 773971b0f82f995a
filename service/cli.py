"""`nib serve`: run the gRPC server."""

from __future__ import annotations

import argparse
import asyncio
import math
import os
from collections.abc import Sequence
from pathlib import Path

import structlog

from nib.engine.speculative import MAX_DRAFT
from nib.service.auth import ApiKeys, KeyFileError
from nib.service.faults import ENV_VAR, FaultPlan
from nib.service.logs import FORMATS, configure_logging
from nib.service.server import MAX_MESSAGE_BYTES, ServerConfig, default_engine_config, serve
from nib.service.tls import TlsConfig


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nib serve", description="Serve completions over gRPC.")
    p.add_argument(
        "--model", type=Path, help="Hugging Face model folder (default: the shipped model)"
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=50051, help="port (default 50051; 0 picks one)")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default)")
    p.add_argument("--dtype", default="auto", help="auto, float32, bfloat16 or float16")
    p.add_argument(
        "--quant",
        default="auto",
        choices=["auto", "none", "int4"],
        help="weights: auto (as the checkpoint is; GPTQ runs INT4), none, or int4 "
        "(round-to-nearest at load for 16-bit checkpoints)",
    )
    p.add_argument("--max-context", type=int, default=2048, help="tokens of prompt + completion")
    p.add_argument("--max-tokens-limit", type=int, default=1024, help="largest max_tokens accepted")
    p.add_argument("--default-max-tokens", type=int, default=64, help="max_tokens when unset")
    p.add_argument("--max-queue", type=int, default=64, help="requests allowed to wait")
    p.add_argument(
        "--speculative-k",
        type=int,
        help="prompt-lookup draft tokens per verify step for greedy requests, 0 to 7; "
        "0 turns drafting off (default: 6 on the CPU, 0 on a GPU, where verify steps "
        "cost more; drafts are verified only where start-up's timing says they pay)",
    )
    p.add_argument(
        "--max-message-bytes",
        type=int,
        default=MAX_MESSAGE_BYTES,
        help=f"largest request message (default {MAX_MESSAGE_BYTES})",
    )
    p.add_argument(
        "--max-concurrent-rpcs",
        type=int,
        default=1024,
        help="open calls (sessions, health watches, ...) before RESOURCE_EXHAUSTED (default 1024)",
    )
    p.add_argument(
        "--grace", type=float, default=5.0, help="seconds to drain on SIGTERM (default 5)"
    )
    p.add_argument(
        "--metrics-port", type=int, help="serve Prometheus metrics on this port (0 picks one)"
    )
    p.add_argument("--metrics-host", default="127.0.0.1", help="address of the metrics endpoint")
    p.add_argument(
        "--api-key-file",
        type=Path,
        help="require API keys: a file of 'tenant:key' lines (see README)",
    )
    p.add_argument("--tls-cert", type=Path, help="PEM certificate chain: serve TLS")
    p.add_argument("--tls-key", type=Path, help="PEM private key of --tls-cert")
    p.add_argument(
        "--tls-client-ca", type=Path, help="require client certificates signed by this CA"
    )
    p.add_argument(
        "--telemetry-interval",
        type=float,
        default=5.0,
        help="seconds between GPU telemetry samples (NVML) and fragmentation checks; 0 turns "
        "them off (default 5)",
    )
    p.add_argument(
        "--fragmentation-threshold",
        type=float,
        default=0.3,
        help="warn when this share of reserved CUDA memory (outside the graph pool) holds no "
        "tensor (default 0.3)",
    )
    p.add_argument(
        "--allow-reference-fallback",
        action="store_true",
        help="on a GPU below the kernels' compute capability (8.0), run the slow PyTorch "
        "reference path instead of refusing to start",
    )
    p.add_argument("--log-level", default="INFO")
    p.add_argument("--log-format", default="json", choices=FORMATS)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging(args.log_level, args.log_format)
    log = structlog.get_logger("nib.service")
    for flag, value, low in (
        ("--max-queue", args.max_queue, 1),
        ("--max-message-bytes", args.max_message_bytes, 1024),
        ("--max-concurrent-rpcs", args.max_concurrent_rpcs, 1),
        ("--grace", args.grace, 0),
        ("--telemetry-interval", args.telemetry_interval, 0),
    ):
        if value < low:
            parser.error(f"{flag} is {value}; must be at least {low}")
    if args.speculative_k is not None and not 0 <= args.speculative_k <= MAX_DRAFT:
        parser.error(
            f"--speculative-k is {args.speculative_k}; must be 0 to {MAX_DRAFT} "
            f"(a verify step holds the current token and {MAX_DRAFT} drafts)"
        )
    if not math.isfinite(args.telemetry_interval):
        parser.error(f"--telemetry-interval is {args.telemetry_interval}; must be a number")
    if not 0 < args.fragmentation_threshold <= 1:
        parser.error(
            f"--fragmentation-threshold is {args.fragmentation_threshold}; must be in (0, 1]"
        )
    if (args.tls_cert is None) != (args.tls_key is None):
        parser.error("--tls-cert and --tls-key go together")
    if args.tls_client_ca is not None and args.tls_cert is None:
        parser.error("--tls-client-ca needs --tls-cert and --tls-key")
    tls = TlsConfig(args.tls_cert, args.tls_key, args.tls_client_ca) if args.tls_cert else None
    try:
        keys = ApiKeys.from_file(args.api_key_file) if args.api_key_file else None
    except (OSError, KeyFileError) as exc:
        parser.error(f"--api-key-file: {exc}")
    faults = None
    if os.environ.get(ENV_VAR):
        faults = FaultPlan.parse(os.environ[ENV_VAR])
        log.warning(
            "FAULT INJECTION ACTIVE: this server will misbehave on purpose", plan=str(faults)
        )
    device = args.device
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    engine = default_engine_config(
        args.model,
        device=device,
        dtype=args.dtype,
        max_context=args.max_context,
        max_tokens_limit=args.max_tokens_limit,
        default_max_tokens=args.default_max_tokens,
        max_queue=args.max_queue,
        speculative_k=args.speculative_k,
        quant=args.quant,
        allow_reference_fallback=args.allow_reference_fallback,
    )
    config = ServerConfig(
        engine=engine,
        host=args.host,
        port=args.port,
        grace_s=args.grace,
        metrics_host=args.metrics_host,
        metrics_port=args.metrics_port,
        api_keys=keys,
        tls=tls,
        max_message_bytes=args.max_message_bytes,
        max_concurrent_rpcs=args.max_concurrent_rpcs,
        faults=faults,
        telemetry_interval_s=args.telemetry_interval,
        fragmentation_threshold=args.fragmentation_threshold,
    )
    asyncio.run(serve(config))
    return 0
