"""bench/capacity.py: the M/D/1 formulas against a simulated queue, and docs/capacity.md
holds exactly what the script computes from the measured decode results."""

from __future__ import annotations

import importlib.util
import json
import random
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def capacity() -> ModuleType:
    spec = importlib.util.spec_from_file_location("capacity", ROOT / "bench" / "capacity.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["capacity"] = module
    spec.loader.exec_module(module)
    return module


def simulated_waits(rate: float, service: float, n: int, seed: int) -> list[float]:
    """Waits in a FIFO single-server queue with Poisson arrivals (Lindley's recursion)."""
    rng = random.Random(seed)
    wait, waits = 0.0, []
    for _ in range(n):
        waits.append(wait)
        wait = max(0.0, wait + service - rng.expovariate(rate))
    waits.sort()
    return waits


@pytest.mark.parametrize(("rate", "service"), [(3.0, 0.2), (1.9, 0.183), (9.6, 0.069)])
def test_md1_wait_quantiles_match_a_simulated_queue(
    capacity: ModuleType, rate: float, service: float
) -> None:
    waits = simulated_waits(rate, service, 200_000, seed=7)
    no_wait = sum(1 for w in waits if w == 0.0) / len(waits)
    assert capacity.md1_wait_cdf(0.0, rate, service) == pytest.approx(no_wait, abs=0.01)
    for q in (0.8, 0.95, 0.99):
        simulated = waits[int(q * len(waits))]
        modelled = capacity.md1_wait_quantile(q, rate, service)
        assert modelled == pytest.approx(simulated, rel=0.05, abs=0.002), q
    rho = rate * service
    mean_queue = rate * sum(waits) / len(waits)  # Little: Lq = lambda * Wq
    assert capacity.md1_mean_queue(rho) == pytest.approx(mean_queue, rel=0.05)


def test_capacity_is_the_largest_load_within_budget(capacity: ModuleType) -> None:
    replica = capacity.Replica("x", ms_per_token=2.0, ttft_ms=5.0, prompt_tokens=512)
    cap = capacity.capacity(replica, tokens=32, budget_ms=200.0, per_minute=10.0)
    service = replica.service_ms(32) / 1000
    assert cap.service_ms == pytest.approx(5.0 + 31 * 2.0)
    allowed = (200.0 - 5.0) / 1000
    assert capacity.md1_wait_quantile(0.95, cap.completions_per_s, service) <= allowed
    assert capacity.md1_wait_quantile(0.95, cap.completions_per_s * 1.01, service) > allowed
    assert cap.editors == int(cap.completions_per_s * 60 / 10.0)
    with pytest.raises(ValueError, match="below the TTFT"):
        capacity.capacity(replica, tokens=32, budget_ms=4.0, per_minute=10.0)


def test_replicas_come_from_the_measured_decode_rows(capacity: ModuleType) -> None:
    data = json.loads(capacity.RESULTS.read_text())
    context = data["prompt_tokens"] + data["new_tokens"]
    rows = {
        r["shape"]: r for r in data["rows"] if r["impl"] == "nib-graphs" and r["context"] == context
    }
    _, replicas = capacity.load_replicas()
    assert {r.shape for r in replicas} == set(rows)
    for r in replicas:
        assert r.ms_per_token == rows[r.shape]["ms_per_token_median"]
        assert r.ttft_ms == rows[r.shape]["ttft_ms"]


def test_the_docs_page_holds_what_the_script_computes(capacity: ModuleType) -> None:
    doc = (ROOT / "docs" / "capacity.md").read_text()
    block = re.search(r"<!-- BEGIN capacity -->\n(.*?)<!-- END capacity -->", doc, re.S)
    assert block is not None
    assert block.group(1) == capacity.tables(32, 250.0, 10.0, 8), (
        "docs/capacity.md is stale: python3 bench/capacity.py --write"
    )


def test_the_docs_page_quotes_the_measured_ring(capacity: ModuleType) -> None:
    doc = " ".join((ROOT / "docs" / "capacity.md").read_text().split())
    ring = json.loads((ROOT / "bench" / "results" / "2026-11-29-affinity-cpu.json").read_text())
    shares = ", ".join(f"{100 * s:.1f} %" for s in ring["three_replicas_share"])
    assert shares.rsplit(", ", 1)[0] + " and " + shares.rsplit(", ", 1)[1] in doc
    assert ring["fresh_envoy_same_ring"] is True
    left, joined = ring["one_left"], ring["one_joined"]
    assert left["of_those_moved"] == left["sessions_of_the_replica_that_left"]
    assert f"{left['of_the_others_moved']} of the other {left['sessions_of_the_others']}" in doc
    assert f"{joined['moved']} of {ring['sessions']} sessions moved" in doc
    assert f"{joined['to_the_new_replica']} to the new replica" in doc
    assert f"{joined['between_the_old_replicas']} between the old ones" in doc
