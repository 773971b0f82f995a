"""A voice-style consumer: speak a completion sentence by sentence while it is generated.

A text-to-speech engine wants whole sentences, as early as possible: this
buffers the deltas and hands over each sentence the moment it is complete,
never waiting for the whole completion. When the listener starts talking
(barge-in) the generation is cancelled on the server at once.

    python examples/voice.py [HOST:PORT] [--barge-in-after SECONDS] [--max-tokens N]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import time
from collections.abc import AsyncIterable, AsyncIterator

from nib.sdk import AsyncClient

# A sentence ends at . ! or ? (closing quotes and brackets included) before a space, or at a newline.
SENTENCE_END = re.compile(r"""[.!?]+["')\]]*\s|\n""")


async def sentences(deltas: AsyncIterable[str], max_chars: int = 160) -> AsyncIterator[str]:
    """Whole sentences from a stream of text deltas.

    A run of text with no sentence end is cut at its last space once it is
    longer than max_chars, so the voice never falls silent for long.
    """
    buffer = ""
    async for delta in deltas:
        buffer += delta
        while True:
            end = SENTENCE_END.search(buffer)
            if end is not None:
                cut = end.end()
            elif len(buffer) > max_chars:
                space = buffer.rfind(" ", 0, max_chars)
                cut = space + 1 if space > 0 else max_chars
            else:
                break
            sentence, buffer = buffer[:cut].strip(), buffer[cut:]
            if sentence:
                yield sentence
    if buffer.strip():
        yield buffer.strip()


async def speak(
    address: str, prompt: str, barge_in_after: float | None, max_tokens: int = 80
) -> None:
    async with AsyncClient(address, timeout=120) as client:
        await client.wait_ready(timeout=30)
        start = time.perf_counter()
        stream = client.complete(prompt, max_tokens=max_tokens, temperature=0.7, seed=11)

        async def say_all() -> None:
            async for sentence in sentences(stream):
                print(
                    f"[say +{(time.perf_counter() - start) * 1000:.0f} ms] {sentence}", flush=True
                )

        talker = asyncio.create_task(say_all())
        try:
            await asyncio.wait_for(asyncio.shield(talker), barge_in_after)
        except TimeoutError:
            # The listener spoke: stop talking; the stream's loop ends with the task, and
            # that cancels the generation on the server.
            talker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await talker
            print(f"[barge-in] cancelled after {len(stream.token_ids)} tokens", flush=True)
        print(f"[end] {stream.finish_reason}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "address", nargs="?", default=os.environ.get("NIB_ADDRESS", "127.0.0.1:50051")
    )
    parser.add_argument("--prompt", default="# Explain what a hash map is, in three sentences.\n")
    parser.add_argument("--barge-in-after", type=float, help="cancel after this many seconds")
    parser.add_argument("--max-tokens", type=int, default=80, help="the reply's length limit")
    args = parser.parse_args()
    asyncio.run(speak(args.address, args.prompt, args.barge_in_after, args.max_tokens))


if __name__ == "__main__":
    main()
