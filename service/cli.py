"""`nib serve`: run the gRPC server."""

from __future__ import annotations

import argparse
import asyncio
import logging
from collections.abc import Sequence
from pathlib import Path

from nib.service.server import ServerConfig, default_engine_config, serve


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
    p.add_argument("--grace", type=float, default=5.0, help="seconds to drain on SIGTERM")
    p.add_argument("--log-level", default="INFO")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
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
        quant=args.quant,
    )
    asyncio.run(
        serve(ServerConfig(engine=engine, host=args.host, port=args.port, grace_s=args.grace))
    )
    return 0
