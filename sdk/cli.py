"""The `nib` command: serve, quantize, complete, health, info, lsp.

Client commands need only the base install; `nib serve` and `nib quantize`
need the server extra (`pip install 'nib[server]'`) and import it lazily.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from nib.sdk.cli_complete import run_complete
from nib.sdk.client import Client
from nib.sdk.connection import DEFAULT_ADDRESS, ConnectionOptions
from nib.sdk.errors import NibError
from nib.sdk.retry import RetryPolicy

EXIT_ERROR = 1
EXIT_USAGE = 2


def add_connection_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("connection")
    g.add_argument(
        "--address",
        default=os.environ.get("NIB_ADDRESS", DEFAULT_ADDRESS),
        help=f"server host:port (default $NIB_ADDRESS or {DEFAULT_ADDRESS})",
    )
    g.add_argument("--tls", action="store_true", help="use TLS, trusting the system's CAs")
    g.add_argument("--ca-file", help="use TLS, trusting only this CA certificate (PEM)")
    g.add_argument("--server-name", help="name the server's certificate must carry")
    g.add_argument(
        "--api-key-file",
        help="file holding the API key (default: $NIB_API_KEY if set); "
        "sent as 'authorization: Bearer <key>'",
    )
    g.add_argument("--timeout", type=float, help="deadline of the call in seconds")


def connection_options(args: argparse.Namespace) -> ConnectionOptions:
    api_key = os.environ.get("NIB_API_KEY") or None
    if args.api_key_file:
        with open(args.api_key_file, encoding="utf-8") as f:
            api_key = f.read().strip()
    return ConnectionOptions(
        address=args.address,
        tls=args.tls,
        ca_file=args.ca_file,
        server_name=args.server_name,
        api_key=api_key,
        timeout=args.timeout,
        # An interactive command should not sit in backoff for long.
        retry=RetryPolicy(max_attempts=3, initial_backoff_s=0.2, max_backoff_s=1.0),
    )


def cmd_complete(args: argparse.Namespace) -> int:
    with Client(options=connection_options(args)) as client:
        return run_complete(client, args)


def cmd_health(args: argparse.Namespace) -> int:
    with Client(options=connection_options(args)) as client:
        if args.wait is not None:
            client.wait_ready(args.wait)
            status = "SERVING"
        else:
            status = client.health(timeout=args.timeout or 5.0)
    print(status)
    if args.verbose:
        from nib.sdk.health_report import fetch_health_detail, format_health_detail

        print(format_health_detail(fetch_health_detail(args.address, args.timeout or 5.0)))
    return 0 if status == "SERVING" else EXIT_ERROR


def cmd_info(args: argparse.Namespace) -> int:
    with Client(options=connection_options(args)) as client:
        info = client.model_info()
    if args.json:
        print(json.dumps({**vars(info), "graphs": [list(g) for g in info.graphs]}))
        return 0
    for key, value in vars(info).items():
        if key != "graphs":
            print(f"{key:17} {value}")
    for name, ready, fallback in info.graphs:
        print(
            f"graph {name:11} {'ready' if ready else 'not ready'}{' (eager)' if fallback else ''}"
        )
    return 0


def cmd_serve(argv: Sequence[str]) -> int:
    try:
        from nib.service.cli import main as serve_main
    except ImportError as exc:
        print(
            f"nib serve needs the server extra: pip install 'nib[server]' ({exc})", file=sys.stderr
        )
        return EXIT_USAGE
    return serve_main(argv)


def cmd_quantize(argv: Sequence[str]) -> int:
    try:
        from nib.engine.quant.cli import main as quantize_main
    except ImportError as exc:
        print(
            f"nib quantize needs the server extra: pip install 'nib[server]' ({exc})",
            file=sys.stderr,
        )
        return EXIT_USAGE
    return quantize_main(argv)


def cmd_lsp(argv: Sequence[str]) -> int:
    from nib.bridge.cli import main as lsp_main

    return lsp_main(argv)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nib", description="Streaming code completions.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("serve", help="serve a model over gRPC (needs nib[server])", add_help=False)
    sub.add_parser(
        "quantize", help="GPTQ-quantise a model to INT4 (needs nib[server])", add_help=False
    )
    sub.add_parser("lsp", help="the editor bridge: a Language Server on stdio", add_help=False)

    p = sub.add_parser(
        "complete",
        help="stream a completion to the terminal",
        description="Stream a completion as it is generated. Ctrl-C stops it on the server.",
    )
    p.add_argument("prompt", help="text to complete (the prefix, with --suffix); - reads stdin")
    p.add_argument("--suffix", help="text after the cursor: fill-in-the-middle")
    p.add_argument("--path", default="", help="file path, for fill-in-the-middle")
    p.add_argument("--language", default="", help="language id, for fill-in-the-middle")
    p.add_argument("--max-tokens", type=int, default=0, help="most tokens (default: server's)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 (default) is greedy")
    p.add_argument("--top-k", type=int, default=0, help="sample from the k likeliest tokens")
    p.add_argument("--top-p", type=float, default=0.0, help="nucleus sampling threshold")
    p.add_argument("--seed", type=int, help="sampler seed (repeatable results)")
    p.add_argument(
        "--stop", action="append", default=[], help="stop string (repeatable; \\n is a newline)"
    )
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print JSON lines: deltas, then done")
    out.add_argument("--verbose", "-v", action="store_true", help="print timings to stderr")
    add_connection_args(p)
    p.set_defaults(func=cmd_complete)

    h = sub.add_parser("health", help="print readiness; exit 0 if SERVING")
    h.add_argument("--wait", type=float, metavar="SECONDS", help="wait up to this for SERVING")
    h.add_argument(
        "--verbose",
        "-v",
        action="store_true",
        help="also print the health detail: self-check, kernels, graphs, versions, GPU state",
    )
    add_connection_args(h)
    h.set_defaults(func=cmd_health)

    i = sub.add_parser("info", help="describe the served model")
    i.add_argument("--json", action="store_true", help="print one JSON object")
    add_connection_args(i)
    i.set_defaults(func=cmd_info)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "serve":
        return cmd_serve(argv[1:])
    if argv and argv[0] == "quantize":
        return cmd_quantize(argv[1:])
    if argv and argv[0] == "lsp":
        return cmd_lsp(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except NibError as exc:
        if getattr(args, "json", False):
            print(json.dumps({"type": "error", "code": exc.code.name, "message": exc.message}))
        print(f"nib: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except (OSError, ValueError) as exc:
        print(f"nib: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return code


if __name__ == "__main__":
    sys.exit(main())
