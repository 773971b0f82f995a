"""`nib lsp`: the Language Server on stdin/stdout, for any editor with an LSP client."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from nib.bridge.server import build_server
from nib.bridge.settings import BridgeSettings
from nib.sdk.connection import DEFAULT_ADDRESS


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="nib lsp",
        description="Code completions from a nib server, as a Language Server on stdio. "
        "Settings sent by the editor (initializationOptions, didChangeConfiguration) "
        "override these flags.",
    )
    p.add_argument("--stdio", action="store_true", help="accepted for editors that pass it")
    p.add_argument(
        "--address",
        default=os.environ.get("NIB_ADDRESS", DEFAULT_ADDRESS),
        help=f"nib server host:port (default $NIB_ADDRESS or {DEFAULT_ADDRESS})",
    )
    p.add_argument("--api-key-file", help="file holding the API key (default: $NIB_API_KEY)")
    p.add_argument("--tls", action="store_true", help="use TLS with the system's CAs")
    p.add_argument("--ca-file", help="use TLS, trusting only this CA certificate (PEM)")
    p.add_argument("--debounce-ms", type=int, default=100, help="quiet time before a request")
    p.add_argument("--max-tokens", type=int, default=128, help="longest completion in tokens")
    p.add_argument("--mode", choices=("auto", "single", "multi"), default="auto")
    p.add_argument("--log-file", help="write the bridge's log here (default: stderr)")
    p.add_argument("--log-level", default="WARNING")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        filename=args.log_file,
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    api_key = os.environ.get("NIB_API_KEY") or None
    if args.api_key_file:
        with open(args.api_key_file, encoding="utf-8") as f:
            api_key = f.read().strip()
    settings = BridgeSettings(
        address=args.address,
        api_key=api_key,
        tls=args.tls or args.ca_file is not None,
        ca_file=args.ca_file,
        debounce_ms=args.debounce_ms,
        max_tokens=args.max_tokens,
        mode=args.mode,
    )
    # stdout carries the protocol: nothing else may be printed there.
    build_server(settings).start_io(sys.stdin.buffer, sys.stdout.buffer)
    return 0
