"""An asyncio agent's use of nib: drafts in parallel, an early stop, a deadline, and a session
on which a newer request replaces an older one.

    python examples/agent_asyncio.py [HOST:PORT]   (default: $NIB_ADDRESS or 127.0.0.1:50051)
"""

from __future__ import annotations

import asyncio
import os
import sys

from nib.sdk import AsyncClient, DeadlineExceeded

STUBS = {
    "add": "def add(a: int, b: int) -> int:\n    ",
    "mean": "def mean(xs: list[float]) -> float:\n    ",
    "greet": "def greet(name: str) -> str:\n    ",
}


async def draft(client: AsyncClient, name: str, prefix: str) -> str:
    """One function body, written between its signature and the rest of the file."""
    result = await client.complete(
        prefix=prefix, suffix="\n", language="python", max_tokens=16, stop=["\ndef "]
    ).result()
    return f"draft {name}: {result.finish_reason}, {result.usage.completion_tokens} tokens"


async def first_line(client: AsyncClient, prompt: str) -> str:
    """Take only the first line; leaving the `async with` cancels the rest on the server."""
    async with client.complete(prompt, max_tokens=60, temperature=0.8, seed=7) as stream:
        async for _ in stream:
            if "\n" in stream.text:
                break
    return stream.text.split("\n", 1)[0]


async def change_of_plan(client: AsyncClient) -> str:
    """The user changed their mind mid-answer: the newer request supersedes the older one."""
    async with client.session() as session:
        plan_a = session.complete("# plan A\n", max_tokens=200, temperature=0.8, seed=1)
        plan_b = None
        async for _ in plan_a:
            if plan_b is None and len(plan_a.token_ids) >= 4:
                plan_b = session.complete("# plan B\n", max_tokens=8)
        if plan_b is None:  # plan A ended before we changed our mind
            plan_b = session.complete("# plan B\n", max_tokens=8)
        b = await plan_b.result()
    return (
        f"plan A: {plan_a.finish_reason} after {len(plan_a.token_ids)} tokens; "
        f"plan B: {b.finish_reason}, {b.usage.completion_tokens} tokens"
    )


async def within(client: AsyncClient, seconds: float) -> str:
    """A step with a time budget: the deadline travels to the server, which stops generating."""
    try:
        result = await client.complete("x = ", max_tokens=500, timeout=seconds).result()
    except DeadlineExceeded:
        return f"deadline: gave up after {seconds:g}s"
    return f"deadline: done in time ({result.usage.completion_tokens} tokens)"


async def main(address: str) -> None:
    async with AsyncClient(address, timeout=120) as client:
        await client.wait_ready(timeout=30)
        for line in await asyncio.gather(*(draft(client, n, p) for n, p in STUBS.items())):
            print(line)
        print(f"first line: {await first_line(client, 'import os')!r}")
        print(await change_of_plan(client))
        print(await within(client, 0.5))


if __name__ == "__main__":
    asyncio.run(
        main(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("NIB_ADDRESS", "127.0.0.1:50051"))
    )
