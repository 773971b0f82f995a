"""How many editors one nib replica serves, from the measured H200 decode latency.

    python3 bench/capacity.py                       # the tables in docs/capacity.md
    python3 bench/capacity.py --tokens 64 --budget-ms 300 --per-minute 6

Nothing here is measured: it is a queueing model fed with measured numbers
(bench/results/*-decode.json, nib's CUDA-graph rows). A replica runs one
completion at a time, first come first served, so it is an M/D/1 queue: Poisson
arrivals (many independent editors), a fixed service time per completion

    S = TTFT (prefill of the measured prompt + first token) + (tokens - 1) * ms/token

and one server. Time to first token seen by an editor is the wait in the queue
plus TTFT. The largest arrival rate whose 95th-percentile time to first token
stays within the budget, divided by the completions an editor asks for per
minute, is the number of editors a replica serves. Session affinity pins each
editor to one replica, so N replicas are N independent queues: capacity grows
linearly with N and so does the cost (one GPU each).

`--write` puts the tables into docs/capacity.md between its BEGIN/END markers.
"""

from __future__ import annotations

import argparse
import decimal
import json
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "2026-12-04-decode.json"
DOC = ROOT / "docs" / "capacity.md"
IMPL = "nib-graphs"
OTHER_BUDGETS_MS = (100.0, 150.0, 500.0, 1000.0)


def md1_wait_cdf(t: float, rate: float, service: float) -> float:
    """P(wait in queue <= t) in an M/D/1 FIFO queue (Erlang's formula):
    (1 - rho) * sum_{k=0}^{floor(t/D)} exp(lam (t - kD)) (-lam (t - kD))^k / k!"""
    rho = rate * service
    if rho >= 1:
        return 0.0
    if t < 0:
        return 0.0
    # The terms alternate in sign and grow like e^(lam t): sum them with 80 digits, or
    # the cancellation eats every significant digit of a double once t >> D.
    with decimal.localcontext() as ctx:
        ctx.prec = 80
        total = decimal.Decimal(0)
        for k in range(int(t // service) + 1):
            x = decimal.Decimal(rate) * (decimal.Decimal(t) - k * decimal.Decimal(service))
            power = (-x) ** k if k else decimal.Decimal(1)
            total += x.exp() * power / math.factorial(k)
        return min(1.0, max(0.0, float((1 - decimal.Decimal(rho)) * total)))


def md1_wait_quantile(q: float, rate: float, service: float) -> float:
    """The q-quantile of the wait (bisection on the CDF; 0 when P(no wait) >= q)."""
    if md1_wait_cdf(0.0, rate, service) >= q:
        return 0.0
    lo, hi = 0.0, service
    while md1_wait_cdf(hi, rate, service) < q:
        hi *= 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if md1_wait_cdf(mid, rate, service) < q else (lo, mid)
    return hi


def md1_mean_queue(rho: float) -> float:
    """Mean number waiting (not being served) in an M/D/1 queue: rho^2 / (2 (1 - rho))."""
    return rho * rho / (2 * (1 - rho))


@dataclass(frozen=True)
class Replica:
    shape: str
    ms_per_token: float
    ttft_ms: float
    prompt_tokens: int

    def service_ms(self, tokens: int) -> float:
        return self.ttft_ms + (tokens - 1) * self.ms_per_token


@dataclass(frozen=True)
class Capacity:
    replica: Replica
    service_ms: float
    rho: float  # the utilisation at which the p95 budget is just met
    completions_per_s: float
    editors: int
    mean_queue: float  # nib_queue_depth averaged over time at that utilisation


def capacity(replica: Replica, tokens: int, budget_ms: float, per_minute: float) -> Capacity:
    """The largest load whose p95 time to first token (wait + TTFT) is within budget."""
    service = replica.service_ms(tokens) / 1000
    allowed_wait = (budget_ms - replica.ttft_ms) / 1000
    if allowed_wait < 0:
        raise ValueError(f"budget {budget_ms} ms is below the TTFT {replica.ttft_ms:.1f} ms")
    lo, hi = 0.0, 1.0 / service  # arrival rates (per second)
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if md1_wait_quantile(0.95, mid, service) <= allowed_wait else (lo, mid)
    rate = lo
    rho = rate * service
    return Capacity(
        replica,
        service * 1000,
        rho,
        rate,
        math.floor(rate * 60 / per_minute),
        md1_mean_queue(rho),
    )


def load_replicas(path: Path = RESULTS) -> tuple[dict[str, object], list[Replica]]:
    data = json.loads(path.read_text())
    context = data["prompt_tokens"] + data["new_tokens"]  # the standard rows (not the 4K ones)
    rows = [r for r in data["rows"] if r["impl"] == IMPL and r["context"] == context]
    replicas = [
        Replica(r["shape"], r["ms_per_token_median"], r["ttft_ms"], data["prompt_tokens"])
        for r in rows
    ]
    return data, replicas


def tables(tokens: int, budget_ms: float, per_minute: float, max_replicas: int) -> str:
    data, replicas = load_replicas()
    caps = [capacity(r, tokens, budget_ms, per_minute) for r in replicas]
    lines = [
        f"Measured: {data['device']}, {data['date']}, `{data['command']}` "
        f"(`{RESULTS.relative_to(ROOT)}`, rows `{IMPL}`: bf16, batch 1, prompt "
        f"{data['prompt_tokens']} tokens, median ms/token over {data['new_tokens']} new tokens). "
        f"Model: {tokens} tokens per completion, p95 time to first token within "
        f"{budget_ms:g} ms, {per_minute:g} completions per editor per minute, "
        f"`python3 bench/capacity.py --tokens {tokens} --budget-ms {budget_ms:g} "
        f"--per-minute {per_minute:g}`.",
        "",
        "| model shape | ms/token | tokens/s | TTFT ms | ms per completion | utilisation at budget "
        "| completions/s | editors per replica | mean queue depth at budget |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in caps:
        r = c.replica
        lines.append(
            f"| {r.shape} | {r.ms_per_token:.3f} | {1000 / r.ms_per_token:.0f} | "
            f"{r.ttft_ms:.1f} | {c.service_ms:.1f} | {c.rho:.2f} | {c.completions_per_s:.2f} | "
            f"{c.editors} | {c.mean_queue:.2f} |"
        )
    lines += [
        "",
        "| replicas (GPUs) | "
        + " | ".join(f"editors, {c.replica.shape} | with one replica down" for c in caps)
        + " |",
        "|---:|" + "---:|---:|" * len(caps),
    ]
    for n in range(1, max_replicas + 1):
        cells = " | ".join(f"{n * c.editors} | {(n - 1) * c.editors}" for c in caps)
        lines.append(f"| {n} | {cells} |")
    lines += [
        "",
        "| p95 TTFT budget (ms) | "
        + " | ".join(f"editors per replica, {r.shape}" for r in replicas)
        + " |",
        "|---:|" + "---:|" * len(replicas),
    ]
    for budget in sorted({*OTHER_BUDGETS_MS, budget_ms}):
        cells = " | ".join(str(capacity(r, tokens, budget, per_minute).editors) for r in replicas)
        lines.append(f"| {budget:g} | {cells} |")
    return "\n".join(lines) + "\n"


def write_doc(text: str, doc: Path = DOC) -> None:
    old = doc.read_text()
    new, count = re.subn(
        r"(<!-- BEGIN capacity -->\n).*?(<!-- END capacity -->)",
        lambda m: m.group(1) + text + m.group(2),
        old,
        flags=re.S,
    )
    if count != 1:
        raise SystemExit(f"{doc} has no <!-- BEGIN capacity --> ... <!-- END capacity --> block")
    doc.write_text(new)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--tokens", type=int, default=32, help="tokens per completion (32)")
    p.add_argument("--budget-ms", type=float, default=250.0, help="p95 TTFT budget (250)")
    p.add_argument("--per-minute", type=float, default=10.0, help="completions/editor/min (10)")
    p.add_argument("--max-replicas", type=int, default=8)
    p.add_argument("--write", action="store_true", help="update docs/capacity.md")
    args = p.parse_args(argv)
    text = tables(args.tokens, args.budget_ms, args.per_minute, args.max_replicas)
    if args.write:
        write_doc(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
