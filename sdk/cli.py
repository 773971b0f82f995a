"""The `nib` command: serve, quantize, complete, health.

Client commands (complete, health) need only the base install; `nib serve` and
`nib quantize` need the server extra (`pip install 'nib[server]'`) and import it lazily.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from nib.sdk.client import DEFAULT_ADDRESS, Client
from nib.sdk.errors import NibError

ADDRESS_HELP = f"server address host:port (default $NIB_ADDRESS or {DEFAULT_ADDRESS})"


def _default_address() -> str:
    return os.environ.get("NIB_ADDRESS", DEFAULT_ADDRESS)


def cmd_complete(args: argparse.Namespace) -> int:
    with Client(args.address, timeout=args.timeout) as client:
        stream = client.complete(
            None if args.suffix is not None else args.prompt,
            prefix=args.prompt if args.suffix is not None else None,
            suffix=args.suffix,
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            seed=args.seed,
            stop=args.stop or (),
        )
        try:
            for text in stream:
                if args.json:
                    print(json.dumps({"text": text}), flush=True)
                else:
                    sys.stdout.write(text)
                    sys.stdout.flush()
        except KeyboardInterrupt:
            stream.cancel()  # the server stops generating within one step
            print("\n[cancelled]", file=sys.stderr)
            return 130
        if args.json:
            print(
                json.dumps(
                    {
                        "finish_reason": stream.finish_reason,
                        "usage": vars(stream.usage),
                        "timings": {
                            "queue_ms": stream.timings.queue_ms,
                            "ttft_ms": stream.timings.ttft_ms,
                            "total_ms": stream.timings.total_ms,
                        },
                    }
                )
            )
        else:
            print()
        if args.verbose:
            t, u = stream.timings, stream.usage
            print(
                f"[{stream.finish_reason}] prompt {u.prompt_tokens} tok, completion "
                f"{u.completion_tokens} tok, ttft {t.ttft_ms:.1f} ms, total {t.total_ms:.1f} ms",
                file=sys.stderr,
            )
    return 0


def cmd_health(args: argparse.Namespace) -> int:
    with Client(args.address) as client:
        status = client.health(timeout=args.timeout or 5.0)
    print(status)
    if args.verbose:
        from nib.sdk.health_report import fetch_health_detail, format_health_detail

        print(format_health_detail(fetch_health_detail(args.address, args.timeout or 5.0)))
    return 0 if status == "SERVING" else 1


def cmd_serve(argv: Sequence[str]) -> int:
    try:
        from nib.service.cli import main as serve_main
    except ImportError as exc:
        print(
            f"nib serve needs the server extra: pip install 'nib[server]' ({exc})", file=sys.stderr
        )
        return 2
    return serve_main(argv)


def cmd_quantize(argv: Sequence[str]) -> int:
    try:
        from nib.engine.quant.cli import main as quantize_main
    except ImportError as exc:
        print(
            f"nib quantize needs the server extra: pip install 'nib[server]' ({exc})",
            file=sys.stderr,
        )
        return 2
    return quantize_main(argv)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nib", description="Streaming code completions.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("serve", help="serve a model over gRPC (needs nib[server])", add_help=False)
    sub.add_parser(
        "quantize", help="GPTQ-quantise a model to INT4 (needs nib[server])", add_help=False
    )

    p = sub.add_parser("complete", help="stream a completion to the terminal")
    p.add_argument("prompt", help="text to complete (the prefix, with --suffix)")
    p.add_argument("--address", default=_default_address(), help=ADDRESS_HELP)
    p.add_argument("--suffix", help="text after the cursor: fill-in-the-middle")
    p.add_argument("--max-tokens", type=int, default=0, help="most tokens to generate")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--seed", type=int, help="sampler seed")
    p.add_argument("--stop", action="append", help="stop string (repeatable)")
    p.add_argument("--timeout", type=float, help="deadline in seconds")
    p.add_argument("--json", action="store_true", help="print JSON lines")
    p.add_argument("--verbose", "-v", action="store_true", help="print timings to stderr")
    p.set_defaults(func=cmd_complete)

    h = sub.add_parser("health", help="exit 0 if the server is SERVING")
    h.add_argument("--address", default=_default_address(), help=ADDRESS_HELP)
    h.add_argument("--timeout", type=float, default=5.0, help="seconds to wait")
    h.add_argument(
        "--verbose",
        "-v",
        action="store_true",
        help="also print the health detail: self-check, kernels, graphs, versions, GPU state",
    )
    h.set_defaults(func=cmd_health)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "serve":
        return cmd_serve(argv[1:])
    if argv and argv[0] == "quantize":
        return cmd_quantize(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except NibError as exc:
        print(f"nib: {exc}", file=sys.stderr)
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
