"""Three `nib serve` replicas behind a real Envoy (deploy/envoy/envoy.yaml, rendered with
loopback addresses): session affinity, spread, and a replica killed under load; then two
replicas, one of which loses its engine: outlier ejection and retries.

Which replica served a completion is read from the replicas' own `request` log events
(by request id) and cross-checked against their `nib_requests_total` metrics.
"""

from __future__ import annotations

import signal
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from nib.engine.default_model import SHIPPED_MODEL
from nib.sdk import Client, NibError
from nib.sdk.client import SESSION_ID_HEADER
from nib.v1 import completion_pb2 as pb
from nib.v1 import completion_pb2_grpc as pb_grpc

from .conftest import wait_for
from .fleet import Fleet, parallel, start_fleet, stop_fleet
from .metrics_util import parse, total

pytestmark = pytest.mark.timeout(240)

REPLICAS = 3
SESSIONS = 24  # over 3 replicas: the chance that one gets none is 3 * (2/3)**24 < 2e-4
MAX_TOKENS = 3
# Every decode step takes at least 10 ms, so that a long completion is still streaming
# when its replica is killed and short ones are still queued behind it.
SLOW_STEPS = {"NIB_FAULT_INJECTION": "step_delay_s=0.01"}
DEADLINE_S = 60.0


@pytest.fixture(scope="module")
def model(random_model_dir: Path) -> Path:
    """The shipped model where it is installed, else the random-init test model."""
    return SHIPPED_MODEL if (SHIPPED_MODEL / "config.json").is_file() else random_model_dir


@pytest.fixture(scope="module")
def fleet(model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    fleet = start_fleet(
        model, tmp_path_factory.mktemp("fleet"), [SLOW_STEPS] * REPLICAS, "--max-context", "512"
    )
    yield fleet
    stop_fleet(fleet)


def new_sessions(n: int = SESSIONS) -> list[str]:
    return [f"editor-{uuid.uuid4().hex[:12]}" for _ in range(n)]


def complete(client: Client, session: str, rid: str, max_tokens: int = MAX_TOKENS) -> str:
    """One completion through the SDK, read to its end; its request id."""
    stream = client.complete(
        "def f(x):", max_tokens=max_tokens, session_id=session, request_id=rid, timeout=DEADLINE_S
    )
    list(stream)
    assert stream.finish_reason == "length", (rid, stream.finish_reason)
    assert stream.usage.completion_tokens == max_tokens
    return rid


def session_call(address: str, session: str, rid: str) -> tuple[str, str]:
    """One start on a Session stream carrying the session header; (request id, the session
    id the server answered with in its initial metadata)."""
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.CompletionServiceStub(channel)
        done = threading.Event()

        def messages() -> Iterator[pb.SessionRequest]:
            yield pb.SessionRequest(
                start=pb.CompleteRequest(prompt="def g(", max_tokens=MAX_TOKENS, request_id=rid)
            )
            done.wait(DEADLINE_S)

        call = stub.Session(
            messages(), metadata=((SESSION_ID_HEADER, session),), timeout=DEADLINE_S
        )
        answered = dict(call.initial_metadata())[SESSION_ID_HEADER]
        for response in call:
            if response.HasField("done"):
                assert response.done.finish_reason == pb.FINISH_REASON_LENGTH, response.done
                done.set()
                break
        call.cancel()
    return rid, answered


def requests_by_replica(fleet: Fleet) -> dict[str, Counter[str]]:
    """address -> {method: nib_requests_total} from each live replica's metrics."""
    out = {}
    for replica in fleet.replicas:
        if replica.address in fleet.killed:
            continue
        samples = parse(replica.metrics())
        out[replica.address] = Counter(
            {m: total(samples, "nib_requests_total", method=m) for m in ("Complete", "Session")}
        )
    return out


def test_each_session_sticks_to_one_replica_and_sessions_spread(fleet: Fleet) -> None:
    sessions = new_sessions()
    before = requests_by_replica(fleet)
    with Client(fleet.envoy.address) as client:
        results = parallel(
            [
                (lambda s=s, k=k: complete(client, s, f"{s}-c{k}"))
                for s in sessions
                for k in range(3)
            ]
            + [(lambda s=s: session_call(fleet.envoy.address, s, f"{s}-s")) for s in sessions]
        )
    errors = [r for r in results if isinstance(r, Exception)]
    assert not errors, errors
    # The server adopted each client's session id on the Session stream.
    assert all(answered == rid[:-2] for rid, answered in results[3 * SESSIONS :])  # type: ignore[misc]

    rids = [f"{s}-c{k}" for s in sessions for k in range(3)] + [f"{s}-s" for s in sessions]
    served = fleet.served_by(rids)
    home = {}
    for s in sessions:
        where = {served[f"{s}-c{k}"] for k in range(3)} | {served[f"{s}-s"]}
        assert len(where) == 1, f"session {s} was served by {where}"
        home[s] = where.pop()
    per_replica = Counter(home.values())
    assert set(per_replica) == {r.address for r in fleet.replicas}, per_replica

    # The replicas' own counters agree with their logs: each counted exactly the Complete
    # calls and Session starts of the sessions that hashed to it.
    after = requests_by_replica(fleet)
    for address, n in per_replica.items():
        counted = after[address] - before[address]
        assert counted == Counter({"Complete": 3 * n, "Session": n}), (address, counted)


def test_killed_replica_sessions_move_and_unstarted_requests_do_not_fail(fleet: Fleet) -> None:
    sessions = new_sessions()
    with Client(fleet.envoy.address) as client:
        errors = [
            r
            for r in parallel([(lambda s=s: complete(client, s, f"{s}-p")) for s in sessions])
            if isinstance(r, Exception)
        ]
        assert not errors, errors
        probed = fleet.served_by([f"{s}-p" for s in sessions])
        home = {s: probed[f"{s}-p"] for s in sessions}
        victim = Counter(home.values()).most_common(1)[0][0]
        moved = [s for s in sessions if home[s] == victim]
        stayed = [s for s in sessions if home[s] != victim]
        assert len(moved) >= 3, f"need 3 sessions on one replica: {Counter(home.values())}"

        # A streams a long completion on the victim; B and C queue behind it there.
        streaming = threading.Event()
        outcome: dict[str, object] = {}

        def long_call() -> None:
            metadata = ((SESSION_ID_HEADER, moved[0]),)
            with grpc.insecure_channel(fleet.envoy.address) as channel:
                stub = pb_grpc.CompletionServiceStub(channel)
                req = pb.CompleteRequest(prompt="def h(", max_tokens=1000, request_id="A")
                messages = 0
                try:
                    for _ in stub.Complete(req, metadata=metadata, timeout=DEADLINE_S):
                        messages += 1
                        streaming.set()
                    outcome["A"] = ("finished", messages)
                except grpc.RpcError as exc:
                    outcome["A"] = (exc.code(), messages)

        def queued(session: str, rid: str) -> None:
            try:
                outcome[rid] = complete(client, session, rid)
            except NibError as exc:
                outcome[rid] = exc

        threads = [threading.Thread(target=long_call)]
        threads[0].start()
        assert streaming.wait(DEADLINE_S), "the long completion never started streaming"
        threads += [
            threading.Thread(target=queued, args=(moved[1], "B")),
            threading.Thread(target=queued, args=(moved[2], "C")),
        ]
        for t in threads[1:]:
            t.start()
        victim_server = fleet.replica(victim)

        def two_queued() -> bool:
            return total(parse(victim_server.metrics()), "nib_queue_depth") == 2

        wait_for(two_queued, DEADLINE_S, "B and C to queue on the victim")

        victim_server.process.send_signal(signal.SIGKILL)
        victim_server.process.wait(30)
        fleet.killed.add(victim)
        # At once, before Envoy's health checks can have noticed: every session asks again.
        at_once = parallel([(lambda s=s: complete(client, s, f"{s}-k")) for s in sessions])
        for t in threads:
            t.join(DEADLINE_S)

        # A had started streaming: it may fail, and does (its replica is gone).
        code, messages = outcome["A"]  # type: ignore[misc]
        assert code != "finished" and messages >= 1, outcome["A"]
        # B and C had not: Envoy retried them on another replica and they completed.
        assert outcome["B"] == "B" and outcome["C"] == "C", outcome
        errors = [
            (s, r) for s, r in zip(sessions, at_once, strict=True) if isinstance(r, Exception)
        ]
        assert not errors, errors

        def victim_out() -> bool:
            return fleet.envoy.host_flags().get(victim, "healthy") != "healthy"

        wait_for(victim_out, 30, "Envoy to take the killed replica out of the ring")
        later = [
            r
            for r in parallel(
                [
                    (lambda s=s, k=k: complete(client, s, f"{s}-l{k}"))
                    for s in sessions
                    for k in (0, 1)
                ]
            )
            if isinstance(r, Exception)
        ]
        assert not later, later

    served = fleet.served_by(
        ["B", "C"] + [f"{s}-k" for s in sessions] + [f"{s}-l{k}" for s in sessions for k in (0, 1)]
    )
    survivors = {r.address for r in fleet.replicas} - {victim}
    assert served["B"] in survivors and served["C"] in survivors, served
    # Once Envoy has rebuilt its ring without the killed replica, every session again
    # keeps to one replica, and the killed replica's sessions are on the others.
    for s in sessions:
        assert served[f"{s}-l0"] == served[f"{s}-l1"] in survivors, s
        assert served[f"{s}-k"] in survivors, s
    # Most sessions of the survivors stayed where their prefix cache is. Not all: the
    # ring keeps its size, so each survivor gains points and takes over some of the
    # other's sessions (about 1 in 6 with 3 replicas; see docs/capacity.md).
    rehomed = [s for s in stayed if served[f"{s}-l0"] != home[s]]
    assert len(rehomed) <= len(stayed) // 2, (len(rehomed), len(stayed))
    for s in stayed:
        assert served[f"{s}-k"] in {home[s], served[f"{s}-l0"]}, s

    # Envoy's access log shows the retries: B's and C's calls took a second attempt, and
    # only calls of the killed replica's sessions were retried.
    def retries_logged() -> bool:
        log = fleet.envoy.access_log()
        return {moved[1], moved[2]} <= {e["session"] for e in log if int(e["attempts"]) >= 2}  # type: ignore[call-overload]

    wait_for(retries_logged, 10, "Envoy's access log to show the retries of B and C")
    retried = {e["session"] for e in fleet.envoy.access_log() if int(e["attempts"]) >= 2}  # type: ignore[call-overload]
    assert retried <= set(moved), retried - set(moved)


def test_a_replica_whose_engine_died_is_ejected_and_its_calls_retried(
    model: Path, tmp_path: Path
) -> None:
    """The broken replica answers UNAVAILABLE at once to every call. Health checks come
    only every 30 s here, so what takes it out of the ring is outlier ejection, and
    until then each of its calls is retried on the healthy replica."""
    crash = {"NIB_FAULT_INJECTION": "engine_crash_after_tokens=1"}
    pair = start_fleet(model, tmp_path, [{}, crash], health_interval_s=30)
    try:
        broken = pair.replicas[1].address
        sessions = new_sessions(40)
        outcomes = []
        with Client(pair.envoy.address) as client:
            for s in sessions:
                try:
                    outcomes.append(complete(client, s, f"{s}-x", max_tokens=2))
                except NibError as exc:
                    outcomes.append(exc)
        # Only the call that crashed the engine fails: it had its first token already.
        failed = [o for o in outcomes if isinstance(o, NibError)]
        assert len(failed) <= 1, failed
        assert "failed_outlier_check" in pair.envoy.host_flags()[broken]
        stats = pair.envoy.stats()
        assert (
            stats["cluster.nib.outlier_detection.ejections_enforced_consecutive_gateway_failure"]
            == 1
        )
        assert stats["cluster.nib.upstream_rq_retry_success"] >= 5
        served = pair.served_by([o for o in outcomes if isinstance(o, str)])
        assert set(served.values()) == {pair.replicas[0].address}
        # The broken replica refused some of them first (then Envoy retried them).
        refused = {
            e["request_id"]
            for e in pair.replicas[1].events()
            if e.get("event") == "request" and e.get("code") == "UNAVAILABLE"
        }
        assert len(refused & set(served)) >= 4, refused
    finally:
        stop_fleet(pair)
