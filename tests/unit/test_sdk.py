"""The SDK's pure parts: requests, retry policy, connection options, errors, stream state."""

from __future__ import annotations

import random
from pathlib import Path

import grpc
import pytest

from nib.sdk import ConnectionOptions, FinishReason, InvalidArgument, NibError, RetryPolicy
from nib.sdk.cli_complete import unescape
from nib.sdk.connection import system_root_certificates
from nib.sdk.errors import ResourceExhausted, from_code, from_rpc_error, status_lost_to_a_write
from nib.sdk.request import build_request
from nib.sdk.retry import should_retry
from nib.sdk.state import StreamState
from nib.v1 import completion_pb2 as pb


def test_prompt_or_infill_never_both() -> None:
    plain = build_request("def f():", max_tokens=5, stop=["\n"], seed=3)
    assert plain.WhichOneof("input") == "prompt" and plain.seed == 3 and list(plain.stop) == ["\n"]
    fim = build_request(prefix="a", suffix="b", path="x.py", language="python")
    assert fim.WhichOneof("input") == "infill" and fim.infill.path == "x.py"
    assert not fim.HasField("seed")
    assert build_request(suffix="only").infill.prefix == ""
    with pytest.raises(ValueError, match="either prompt, or prefix"):
        build_request("x", prefix="y")
    with pytest.raises(ValueError, match="either prompt, or prefix"):
        build_request()
    with pytest.raises(TypeError, match="wrap a single stop string"):
        build_request("x", stop="\n")
    with pytest.raises(ValueError, match="seed is -1"):
        build_request("x", seed=-1)


def test_request_ids_are_fresh_unless_given() -> None:
    assert build_request("x").request_id != build_request("x").request_id
    assert build_request("x", request_id="mine").request_id == "mine"


def test_backoff_grows_is_capped_and_jittered() -> None:
    policy = RetryPolicy(max_attempts=10, initial_backoff_s=0.1, max_backoff_s=1.0, multiplier=2)
    rng = random.Random(0)
    for retry, ceiling in [(1, 0.1), (2, 0.2), (3, 0.4), (4, 0.8), (5, 1.0), (9, 1.0)]:
        delays = [policy.backoff(retry, rng) for _ in range(200)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays)
        assert max(delays) - min(delays) > ceiling / 4, "jitter spreads the delays"


def test_retry_policy_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="max_attempts is 0"):
        RetryPolicy(max_attempts=0)
    with pytest.raises(ValueError, match="initial_backoff_s"):
        RetryPolicy(initial_backoff_s=5, max_backoff_s=1)
    with pytest.raises(ValueError, match="multiplier"):
        RetryPolicy(multiplier=0.5)


def test_only_unavailable_before_anything_arrived_within_attempts_and_deadline() -> None:
    p = RetryPolicy(max_attempts=3)

    def retry(
        code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE,
        attempts: int = 1,
        received: bool = False,
        remaining: float | None = None,
    ) -> bool:
        return should_retry(
            p, code, attempts=attempts, received=received, delay=0.1, remaining=remaining
        )

    assert retry() and retry(remaining=0.5)
    assert not retry(grpc.StatusCode.INVALID_ARGUMENT)
    assert not retry(grpc.StatusCode.DEADLINE_EXCEEDED)
    assert not retry(received=True)
    assert not retry(attempts=3)
    assert not retry(remaining=0.05)  # the backoff would outlast the deadline


def test_connection_options() -> None:
    plain = ConnectionOptions("h:1")
    assert not plain.secure and plain.metadata() == ()
    names = dict(plain.channel_options())
    assert "grpc.keepalive_time_ms" not in names and names["grpc.enable_retries"] == 0
    assert names["grpc.max_reconnect_backoff_ms"] == 2000
    keyed = ConnectionOptions("h:1", api_key="secret-key", keepalive_s=30, ca_file="ca.pem")
    assert keyed.secure and keyed.metadata() == (("authorization", "Bearer secret-key"),)
    assert dict(keyed.channel_options())["grpc.keepalive_time_ms"] == 30_000
    assert ConnectionOptions(timeout=2).deadline(None) == 2
    assert ConnectionOptions(timeout=2).deadline(0.5) == 0.5
    with pytest.raises(ValueError, match="timeout is 0"):
        ConnectionOptions(timeout=0)
    with pytest.raises(ValueError, match="api_key must be printable"):
        ConnectionOptions(api_key="a\nb")


def test_system_roots_follow_ssl_cert_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bundle = tmp_path / "roots.pem"
    bundle.write_bytes(b"-----BEGIN CERTIFICATE-----\n")
    monkeypatch.setenv("SSL_CERT_FILE", str(bundle))
    assert system_root_certificates() == bundle.read_bytes()


def test_errors_carry_status_and_message() -> None:
    err = from_code(3, "max_tokens: is 9; must be at most 8")
    assert isinstance(err, InvalidArgument) and err.code == grpc.StatusCode.INVALID_ARGUMENT
    assert err.message == "max_tokens: is 9; must be at most 8"
    assert str(err) == "INVALID_ARGUMENT: max_tokens: is 9; must be at most 8"
    assert isinstance(from_code(8, "full"), ResourceExhausted)
    unknown = from_code(999, "?")
    assert type(unknown) is NibError and unknown.code == grpc.StatusCode.UNKNOWN
    assert from_rpc_error(grpc.RpcError()).code == grpc.StatusCode.UNKNOWN


def delta(text: str, *ids: int) -> pb.CompleteResponse:
    return pb.CompleteResponse(request_id="r", delta=pb.Delta(text=text, token_ids=ids))


def done(reason: int, **kw: object) -> pb.CompleteResponse:
    return pb.CompleteResponse(request_id="r", done=pb.Done(finish_reason=reason, **kw))


def test_state_accumulates_deltas_and_the_done() -> None:
    s = StreamState("r")
    assert s._apply(delta("ab", 1, 2)) == "ab" and s._apply(delta("", 3)) == ""
    assert s._apply(delta("c", 4)) == "c" and not s.done
    s._apply(
        done(
            pb.FINISH_REASON_STOP,
            stop="\n",
            usage=pb.Usage(prompt_tokens=2, completion_tokens=4),
            timings=pb.Timings(
                ttft_ms=5, total_ms=9, inter_token_ms=[1, 2, 1], arrival_unix_ms=1.5e12
            ),
        )
    )
    assert s.done and s.finish_reason == FinishReason.STOP == "stop" and s.stop == "\n"
    assert s.text == "abc" and s.token_ids == [1, 2, 3, 4] and s.token_deltas == 3
    assert s.usage.completion_tokens == 4 and s.timings.inter_token_ms == (1, 2, 1)
    assert s.timings.arrival_unix_ms == 1.5e12
    assert s._result().text == "abc"


def test_state_stamps_every_token_even_those_without_text() -> None:
    s = StreamState("r")
    s._apply(delta("", 1))  # e.g. a byte inside a UTF-8 character: no text yet
    s._apply(delta("ab", 2, 3))
    s._apply(delta("c"))  # held-back text flushed at the end: no token
    s._apply(done(pb.FINISH_REASON_LENGTH, usage=pb.Usage(completion_tokens=3)))
    assert len(s.token_times) == len(s.token_ids) == 3
    assert s.token_times[1] == s.token_times[2] and s.token_times == sorted(s.token_times)
    assert s.token_deltas == 2  # the flushed text carried no token
    assert s._started <= s.token_times[0]


def test_state_raises_the_typed_error_of_an_error_done() -> None:
    s = StreamState("r")
    with pytest.raises(InvalidArgument, match="prompt: must not be empty"):
        s._apply(done(pb.FINISH_REASON_ERROR, error="prompt: must not be empty", error_code=3))
    assert s.finish_reason == FinishReason.ERROR


def test_a_cancel_keeps_its_reason_when_the_servers_done_arrives() -> None:
    s = StreamState("r")
    assert s._mark_cancelled() and not s._mark_cancelled()
    s._record_done(done(pb.FINISH_REASON_CANCELLED, usage=pb.Usage(completion_tokens=7)).done)
    assert s.finish_reason == "cancelled" and s.usage.completion_tokens == 7


def test_command_line_escapes() -> None:
    assert unescape(r"\n") == "\n" and unescape(r"a\tb\\n") == "a\tb\\n"
    assert unescape("ünïcode") == "ünïcode"


def _aio_error(code: grpc.StatusCode, details: str, debug: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(
        code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=details, debug_error_string=debug
    )


def test_a_status_grpcio_lost_to_a_racing_write_reads_as_unavailable() -> None:
    lost = _aio_error(
        grpc.StatusCode.INTERNAL,
        "Internal error from Core",
        'Failed "execute_batch": (<grpc._cython.cygrpc.SendMessageOperation object>,)',
    )
    seen = status_lost_to_a_write(lost)
    assert seen.code() == grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]
    assert "36066" in seen.details()  # type: ignore[attr-defined]
    # Every other error, INTERNAL ones with other words included, stays as it was.
    for other in (
        _aio_error(grpc.StatusCode.INTERNAL, "model crashed", 'Failed "execute_batch"'),
        _aio_error(grpc.StatusCode.INTERNAL, "Internal error from Core", "something else"),
        _aio_error(grpc.StatusCode.UNAUTHENTICATED, "Internal error from Core", "execute_batch"),
    ):
        assert status_lost_to_a_write(other) is other
