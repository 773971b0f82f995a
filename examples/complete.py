"""Stream one fill-in-the-middle completion to the terminal, then say how long it took.

python examples/complete.py [HOST:PORT]      (default: $NIB_ADDRESS or 127.0.0.1:50051)
"""

from __future__ import annotations

import os
import sys

from nib.sdk import Client, NibError

PREFIX = "def fibonacci(n):\n    "
SUFFIX = "\n\nprint(fibonacci(10))\n"


def main() -> int:
    address = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("NIB_ADDRESS", "127.0.0.1:50051")
    with Client(address, timeout=60) as client:
        try:
            client.wait_ready(timeout=30)
            stream = client.complete(
                prefix=PREFIX,
                suffix=SUFFIX,
                path="fib.py",
                language="python",
                max_tokens=64,
                stop=["\n\n"],
            )
            print(PREFIX, end="")
            for text in stream:  # each delta as soon as the server has it
                print(text, end="", flush=True)
            print(SUFFIX, end="")
        except NibError as exc:  # typed: InvalidArgument, Unavailable, DeadlineExceeded, ...
            print(f"failed: {exc}", file=sys.stderr)
            return 1
    t = stream.timings
    print(
        f"[{stream.finish_reason}] {stream.usage.completion_tokens} tokens; "
        f"first token after {t.ttft_ms:.0f} ms, all after {t.total_ms:.0f} ms",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
