"""Stability: long decoding and a storm of mixed requests on one engine (issue 6).

    python3 bench/stability.py                                           # shipped model, CPU
    python3 bench/stability.py --device cuda --shape qwen2.5-coder-1.5b  # 10,000 steps, 1,000 requests
    python3 bench/stability.py --device cuda --shape qwen2.5-coder-1.5b --quant int4  # issue 6's INT4 path
    python3 bench/stability.py --device cpu --steps 64 --requests 20     # a quick look

One engine, configured as the server runs it (CUDA graphs, prefix reuse, and
prompt-lookup drafting where the server drafts by default, on the CPU; on a GPU
`--speculative-k 6` puts the drafting loop under the same storm), in this order:

1. warm-up: a short burst of mixed requests, so every path has run once;
2. check: a greedy and a fixed-seed sampled request; then memory is read;
3. phase A: --steps tokens decoded back to back, sampled (top-k 40, fixed seed),
   so that on a GPU every token is one decode graph replay (sampling takes no
   drafts). One request when the context holds prompt + steps; otherwise
   consecutive requests, each filling the context (the row says how many);
4. phase B: --requests requests from 8 concurrent sessions, random prompt
   lengths (seeded): run to completion (greedy or seeded sampling), cancelled
   after a random number of tokens, or superseded by the session's next request
   as the Session RPC does it (cancel with SUPERSEDED, then submit);
5. check again: the same two requests must give the same tokens; memory again.

Passes when no graph ran eagerly, every request ended with exactly one DoneEvent
and none with an error, both checks repeat their tokens, and on CUDA the bytes the
live tensors asked for (the allocator's `requested_bytes`; `allocated` also holds its
rounding and unsplit block tails, reported beside it) are at the end at most 1 MiB
above their value after warm-up. Two bounded
caches are left out of that comparison, their bytes reported beside it: the prefix
cache's stashed copies (entries and a byte budget) and the token healer's device
biases (engine/healing.py: at most BIAS_CACHE vocabulary rows, which must hold at
the end); both legitimately differ between the two points. Random-init
shapes have their special-token rows zeroed (typing_trace.random_model_dir) so
generation does not stop at once; they are 16-bit checkpoints, so `--quant int4` is what
puts the INT4 kernels under the run (round-to-nearest at load, as `nib serve --quant int4`
does), and the row's `quant` says which weights ran. Merges its row into
bench/results/<date>-stability.json (by device, shape and quant); exits 1 if it failed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import queue
import random
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from nib.engine.engine import Engine, EngineConfig
from nib.engine.errors import EngineError
from nib.engine.handle import Handle
from nib.engine.memory import graph_pool_usage
from nib.engine.prefix_cache import common_prefix
from nib.engine.request import DoneEvent, Event, FinishReason, GenerationParams, Prompt, Usage

ROOT = Path(__file__).resolve().parent.parent
MIB = 1 << 20
SESSIONS = 8  # more than the prefix cache's 4 entries: the checks' prefixes are evicted
EVENT_TIMEOUT_S = 120.0  # the longest wait for a request's next event before it counts as lost
SHORT_PROMPT = 512  # most prompts are at most this long; one in ten up to the context's limit
TYPED = 16  # most tokens a superseding prompt adds to the one it replaces
MIN_REUSE = 4  # PrefixCache's default: prompts sharing fewer leading tokens reuse nothing
CHECK_GREEDY = "# stability check: greedy\nimport os\n\n\ndef main():\n    "
CHECK_SAMPLED = '"""Stability check: sampled."""\n\n\nclass Settings:\n    def __init__(self):\n'
CHECK_SEED = 1234
LONG_PROMPT = "import sys\n\n\ndef main():\n    "
NATURAL = (FinishReason.LENGTH, FinishReason.END_OF_TEXT, FinishReason.STOP)


def sampled(seed: int, max_tokens: int, temperature: float = 0.8) -> GenerationParams:
    # top-k keeps sampling among real tokens on random-init models (their special rows are 0)
    return GenerationParams(max_tokens=max_tokens, temperature=temperature, top_k=40, seed=seed)


@dataclass
class Tracked:
    """One submitted request as the bench sees it; terminal events counted on arrival."""

    request_id: str
    kind: str
    prompt_tokens: int
    events: queue.Queue[Event] = field(default_factory=queue.Queue)
    handle: Handle | None = None
    done: DoneEvent | None = None  # the first DoneEvent read
    terminal: int = 0  # DoneEvents delivered: must end at exactly 1
    after_done: int = 0  # events of any kind delivered after the first DoneEvent
    tokens: list[int] = field(default_factory=list)
    withdrawn: bool = False  # ended while still queued (the bench sent its DoneEvent)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def sink(self, event: Event) -> None:
        with self._lock:
            if self.terminal:
                self.after_done += 1
            if isinstance(event, DoneEvent):
                self.terminal += 1
        self.events.put(event)


class Client:
    """Submits, cancels and reads requests the way the service's asyncio side does."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.records: list[Tracked] = []
        self.timed_out = threading.Event()  # once set, sessions stop submitting
        self.refused: list[str] = []  # submits the engine refused
        self._lock = threading.Lock()

    def submit(
        self, prompt: list[int], params: GenerationParams, session: str, kind: str
    ) -> Tracked:
        with self._lock:
            t = Tracked(f"{kind}-{len(self.records)}", kind, len(prompt))
            self.records.append(t)
        t.handle = self.engine.submit(prompt, params, t.sink, t.request_id, session)
        return t

    @staticmethod
    def cancel(t: Tracked, reason: FinishReason) -> None:
        """As aio.Completion.cancel: a request withdrawn before it started ends here."""
        assert t.handle is not None
        if t.handle.withdraw(reason):
            t.withdrawn = True
            t.sink(DoneEvent(reason, Usage(prompt_tokens=t.prompt_tokens)))

    def read(self, t: Tracked, tokens: int | None = None) -> bool:
        """Read until the request is done (or has `tokens` tokens); False on a timeout."""
        while t.done is None and (tokens is None or len(t.tokens) < tokens):
            try:
                event = t.events.get(timeout=EVENT_TIMEOUT_S)
            except queue.Empty:
                self.timed_out.set()
                return False
            if isinstance(event, DoneEvent):
                t.done = event
            else:
                t.tokens.extend(event.token_ids)
        return True

    def run(self, prompt: list[int], params: GenerationParams, session: str, kind: str) -> Tracked:
        t = self.submit(prompt, params, session, kind)
        self.read(t)
        return t


@dataclass(frozen=True)
class Step:
    kind: str  # complete | sampled | cancel | supersede
    start: int  # offset of the prompt in the corpus
    length: int
    max_tokens: int
    after: int  # tokens read before cancelling or superseding
    seed: int
    typed: int  # supersede: tokens the replacement's prompt adds to this one's


def plan(
    rng: random.Random,
    requests: int,
    corpus: list[int],
    max_prompt: int,
    max_new: int,
    avoid: list[list[int]],
) -> list[Step]:
    """Steps whose requests (a supersede is two: the superseded one and its
    replacement) add up to `requests`. No prompt starts like one in `avoid`."""
    steps, count = [], 0
    while count < requests:
        kind = rng.choices(("complete", "sampled", "cancel", "supersede"), (3, 2, 3, 2))[0]
        if kind == "supersede" and count + 2 > requests:
            kind = "complete"
        short = min(SHORT_PROMPT, max_prompt)
        length = rng.randint(1, short) if rng.random() < 0.9 else rng.randint(short, max_prompt)
        typed = rng.randint(1, TYPED)
        while True:
            start = rng.randrange(len(corpus) - length - typed)
            head = corpus[start : start + MIN_REUSE]
            if all(common_prefix(head, a) < MIN_REUSE for a in avoid):
                break
        max_tokens = rng.randint(1, max_new)
        after = rng.randint(0, max_tokens - 1)
        steps.append(Step(kind, start, length, max_tokens, after, rng.randrange(1 << 31), typed))
        count += 2 if kind == "supersede" else 1
    return steps


def run_session(client: Client, session: str, steps: list[Step], corpus: list[int]) -> None:
    try:
        play(client, session, steps, corpus)
    except EngineError as exc:  # the engine refused a submit: stop this session, say why
        client.refused.append(f"{type(exc).__name__}: {exc}")


def play(client: Client, session: str, steps: list[Step], corpus: list[int]) -> None:
    for step in steps:
        if client.timed_out.is_set():
            return
        prompt = corpus[step.start : step.start + step.length]
        if step.kind == "sampled":
            temperature = 0.3 + (step.seed % 10) / 10
            client.run(prompt, sampled(step.seed, step.max_tokens, temperature), session, "sampled")
            continue
        params = GenerationParams(max_tokens=step.max_tokens)
        if step.kind == "complete":
            client.run(prompt, params, session, "complete")
            continue
        t = client.submit(prompt, params, session, step.kind)
        client.read(t, step.after)
        if step.kind == "cancel":
            client.cancel(t, FinishReason.CANCELLED)
            client.read(t)
            continue
        # The user typed on: the Session RPC cancels the running request, then starts the next.
        client.cancel(t, FinishReason.SUPERSEDED)
        typed = corpus[step.start : step.start + step.length + step.typed]
        successor = client.submit(typed, params, session, "replacement")
        client.read(t)
        client.read(successor)


def storm(client: Client, steps: list[Step], corpus: list[int]) -> list[Tracked]:
    """Run the steps from SESSIONS concurrent sessions; the requests they made."""
    first = len(client.records)
    threads = [
        threading.Thread(
            target=run_session, args=(client, f"editor-{i}", steps[i::SESSIONS], corpus)
        )
        for i in range(SESSIONS)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    time.sleep(0.2)  # any stray event after a DoneEvent would arrive meanwhile
    return client.records[first:]


def long_decode(client: Client, steps: int) -> dict[str, Any]:
    """Phase A: `steps` tokens, in as few consecutive requests as the context allows."""
    engine = client.engine
    prompt = engine.encode_prompt(Prompt(text=LONG_PROMPT))
    decoded, requests, ends = 0, 0, Counter[str]()
    started = time.perf_counter()
    while decoded < steps:
        budget = min(
            steps - decoded, engine.max_context - len(prompt), engine.config.max_tokens_limit
        )
        t = client.run(prompt, sampled(CHECK_SEED + requests, budget), "long", "long")
        requests += 1
        if t.done is None or t.done.finish_reason not in NATURAL or not t.tokens:
            break
        decoded += len(t.tokens)
        ends[t.done.finish_reason.value] += 1
    elapsed = time.perf_counter() - started
    note = "one request"
    if requests > 1:
        note = (
            f"{requests} consecutive requests (context {engine.max_context}, "
            f"prompt {len(prompt)} tokens; ends: {dict(ends)})"
        )
    return {
        "decode_steps": decoded,
        "phase_a_requests": requests,
        "phase_a_note": note,
        "phase_a_s": round(elapsed, 2),
        "phase_a_tokens_per_s": round(decoded / elapsed, 1) if elapsed > 0 else None,
    }


def fixed_outputs(client: Client, new: int) -> list[tuple[int, ...]]:
    """Tokens of a greedy and a fixed-seed sampled request (prompts no other request shares)."""
    encode = client.engine.encode_prompt
    greedy = client.run(
        encode(Prompt(text=CHECK_GREEDY)), GenerationParams(max_tokens=new),
        "check-greedy", "check",
    )  # fmt: skip
    drawn = client.run(
        encode(Prompt(text=CHECK_SAMPLED)), sampled(CHECK_SEED, new),
        "check-sampled", "check",
    )  # fmt: skip
    return [tuple(greedy.tokens), tuple(drawn.tokens)]


def memory(engine: Engine) -> dict[str, int | None]:
    """The allocator's counters, the graph pool now, and the two bounded caches' bytes."""
    caches = {  # bounded: left out of the growth check, reported beside it
        "prefix_stash": sum(e.nbytes for e in engine.prefix.entries) if engine.prefix else 0,
        "healing_bias": engine.healer.cached_bytes if engine.healer else 0,
    }
    if engine.device.type != "cuda":
        return {
            "allocated": None,
            "requested": None,
            "reserved": None,
            "graph_pool": None,
            **caches,
        }
    torch.cuda.synchronize(engine.device)
    runner = engine.runner
    pool = graph_pool_usage(engine.device, runner.pool, 0) if runner and runner.pool else None
    return {
        "allocated": torch.cuda.memory_allocated(engine.device),
        # The bytes the live tensors asked for: the caches' nbytes are in the same measure,
        # where "allocated" also holds the allocator's rounding and unsplit block tails
        # (up to ~1 MiB a tensor of the large pool, e.g. a 7B prefix stash's 64 copies).
        "requested": torch.cuda.memory_stats(engine.device).get("requested_bytes.all.current"),
        "reserved": torch.cuda.memory_reserved(engine.device),
        # "reserved-delta" is a start-up measure: meaningless read again here
        "graph_pool": pool.reserved if pool and pool.method == "snapshot" else None,
        **caches,
    }


def outcomes(records: list[Tracked]) -> dict[str, int]:
    count = Counter[str]()
    for t in records:
        if t.terminal == 0 or t.done is None:
            count["lost"] += 1
        elif t.done.finish_reason in NATURAL:
            count["completed"] += 1
        else:
            count[t.done.finish_reason.value] += 1  # cancelled | superseded | error
        count["duplicated"] += t.terminal > 1 or t.after_done > 0
        count["withdrawn"] += t.withdrawn
    keys = ("completed", "cancelled", "superseded", "error", "lost", "duplicated", "withdrawn")
    return {key: count[key] for key in keys}


def failures(row: dict[str, Any], cuda: bool) -> list[str]:
    """Why a row does not pass (empty: it passes)."""
    why = []
    if row.get("quant_asked", "auto") not in ("auto", row.get("quant", "none")):
        why.append(f"asked for {row['quant_asked']} weights, the engine ran {row['quantization']}")
    if row["graph_fallbacks"] or row["graphs_not_captured"]:
        why.append(
            f"graph fallbacks {row['graph_fallbacks']}, not captured {row['graphs_not_captured']}"
        )
    if cuda and not row["graphs_captured"]:
        why.append("no CUDA graph was captured")
    if row["lost"] or row["other_lost"]:
        why.append(f"{row['lost']} requests (+{row['other_lost']} outside phase B) never ended")
    if row["duplicated"] or row["other_duplicated"]:
        why.append("requests got events after their DoneEvent")
    if row["errors"] or row["other_errors"]:
        why.append(f"{row['errors']} requests (+{row['other_errors']} outside phase B) failed")
    if row["refused"]:
        why.append(f"the engine refused submits: {row['refused'][:3]}")
    if row["requests"] != row["requests_planned"]:
        why.append(f"{row['requests']} of {row['requests_planned']} requests ran")
    if row["decode_steps"] < row["decode_steps_planned"]:
        why.append(f"phase A decoded {row['decode_steps']} of {row['decode_steps_planned']} tokens")
    if not row["same_output_fixed_seed"]:
        why.append("the fixed-seed and greedy checks changed their tokens")
    if cuda:
        caches_end = row["prefix_stash_bytes_end"] + row["healing_bias_bytes_end"]
        caches_start = row["prefix_stash_bytes_start"] + row["healing_bias_bytes_start"]
        # Requested bytes where the row has them (rows before 2026-12-06: allocated).
        measure = "requested" if row.get("memory_requested_start") is not None else "allocated"
        grew = (row[f"memory_{measure}_end"] - caches_end) - (
            row[f"memory_{measure}_start"] - caches_start
        )
        if grew > MIB:
            why.append(
                f"{measure} memory grew by {grew} bytes (prefix stash and healing biases excluded)"
            )
        if row["healing_bias_bytes_end"] > row["healing_bias_bytes_bound"]:
            why.append(
                f"the healing biases hold {row['healing_bias_bytes_end']} bytes, above their "
                f"bound of {row['healing_bias_bytes_bound']}"
            )
    return why


def stability(
    engine: Engine, steps: int, requests: int, seed: int, max_new: int, warmup: int
) -> dict[str, Any]:
    client = Client(engine)
    avoid = [engine.encode_prompt(Prompt(text=t)) for t in (CHECK_GREEDY, CHECK_SAMPLED)]
    corpus = [
        i
        for f in sorted((ROOT / "engine").glob("*.py"))
        for i in engine.tokenizer.encode(f.read_text())
    ]
    max_prompt = min(engine.max_context - max_new - TYPED - 1, len(corpus) // 2)
    rng = random.Random(seed)
    storm(client, plan(rng, warmup, corpus, max_prompt, max_new, avoid), corpus)
    before = fixed_outputs(client, max_new)
    start = memory(engine)
    print(f"warmed up: {json.dumps(start)}", flush=True)
    row: dict[str, Any] = {"decode_steps_planned": steps}
    row.update(long_decode(client, steps))
    print(f"phase A: {row['decode_steps']} tokens, {row['phase_a_note']}", flush=True)
    steps_b = plan(rng, requests, corpus, max_prompt, max_new, avoid)
    started = time.perf_counter()
    records = storm(client, steps_b, corpus)
    row["phase_b_s"] = round(time.perf_counter() - started, 2)
    after = fixed_outputs(client, max_new)
    end = memory(engine)
    counts = outcomes(records)
    phase_b = set(map(id, records))
    other = outcomes([t for t in client.records if id(t) not in phase_b])  # warm-up, checks, A
    print(f"phase B: {json.dumps(counts)}", flush=True)
    states = engine.runner.states.values() if engine.runner else ()
    row.update(
        requests=len(records),
        requests_planned=requests,
        planned=dict(Counter(s.kind for s in steps_b)),
        completed=counts["completed"],
        cancelled=counts["cancelled"],
        superseded=counts["superseded"],
        errors=counts["error"],
        lost=counts["lost"],
        duplicated=counts["duplicated"],
        withdrawn=counts["withdrawn"],
        refused=client.refused,
        other_lost=other["lost"],
        other_duplicated=other["duplicated"],
        other_errors=other["error"],
        graph_fallbacks=sum(engine.stats.graph_fallback_counts().values()),
        graphs_captured=sum(s.ready for s in states),
        graphs_not_captured=[s.name for s in states if s.fallback],
        same_output_fixed_seed=before == after and all(before),
        memory_allocated_start=start["allocated"],
        memory_allocated_end=end["allocated"],
        memory_requested_start=start["requested"],
        memory_requested_end=end["requested"],
        memory_reserved_start=start["reserved"],
        memory_reserved_end=end["reserved"],
        graph_pool_bytes_start=start["graph_pool"],
        graph_pool_bytes_end=end["graph_pool"],
        prefix_stash_bytes_start=start["prefix_stash"],
        prefix_stash_bytes_end=end["prefix_stash"],
        healing_bias_bytes_start=start["healing_bias"],
        healing_bias_bytes_end=end["healing_bias"],
        healing_bias_bytes_bound=engine.healer.bound_bytes if engine.healer else 0,
        max_context=engine.max_context,
        seed=seed,
    )
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--shape",
        default="nib-tiny-code",
        help="nib-tiny-code (the shipped model) or a bench/decode.py shape",
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=10_000, help="phase A's decoded tokens")
    parser.add_argument("--requests", type=int, default=1_000, help="phase B's requests")
    parser.add_argument(
        "--max-new",
        type=int,
        default=64,
        help="the most tokens a phase B or check request asks for",
    )
    parser.add_argument("--warmup", type=int, default=16, help="requests before memory is read")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--speculative-k", type=int, default=None, help="draft tokens (default: the server's)"
    )
    parser.add_argument(
        "--quant",
        choices=("auto", "none", "int4"),
        default="auto",
        help="the weights the engine runs (auto: as the checkpoint is; int4: RTN at load)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    command = "python3 bench/stability.py " + " ".join(argv if argv is not None else sys.argv[1:])
    cuda = args.device.startswith("cuda")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        if args.shape == "nib-tiny-code":
            from nib.engine.default_model import default_model_dir

            model_dir = default_model_dir()
        else:
            sys.path.insert(0, str(ROOT / "bench"))
            from typing_trace import random_model_dir

            model_dir = random_model_dir(args.shape, Path(tmp))
        config = EngineConfig(
            model_dir=model_dir,
            device=args.device,
            max_context=max(2048, args.steps + 64),  # the engine caps it at the model's
            max_tokens_limit=max(1024, args.steps),
            speculative_k=args.speculative_k,
            quant=args.quant,
        )
        engine = Engine(config).start()
        try:
            assert engine.wait_ready(900), engine.failure
            quantization = engine.info().quantization  # what ran, as model-info reports it
            row = stability(engine, args.steps, args.requests, args.seed, args.max_new, args.warmup)
            row["speculative_k"] = engine.speculative_k
        finally:
            engine.stop()
    if cuda:
        sys.path.insert(0, str(ROOT / "bench"))
        from common import device_name

        device = device_name()
    else:
        device = "cpu"
    quant = "int4" if quantization.startswith("int4") else "none"
    row = {"shape": args.shape, "device": device, "quant": quant, **row}
    row["quant_asked"] = args.quant
    row["quantization"] = quantization
    row["wall_s"] = round(time.perf_counter() - started, 1)
    row["failures"] = failures(row, cuda)
    row["passed"] = not row["failures"]
    row["command"] = command
    print(json.dumps(row), flush=True)
    today = dt.date.today().isoformat()
    path = args.out / f"{today}-stability.json"
    args.out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"rows": []}
    if path.exists():
        result = json.loads(path.read_text())
    # Rows from before `quant` was recorded ran the 16-bit checkpoints as they were.
    key = (device, args.shape, quant)
    keep = [r for r in result["rows"] if (r["device"], r["shape"], r.get("quant", "none")) != key]
    result.update(date=today, device=device, torch=torch.__version__, command=command)
    result["rows"] = [*keep, row]
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}; {'passed' if row['passed'] else 'FAILED: ' + '; '.join(row['failures'])}")
    return 0 if row["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
