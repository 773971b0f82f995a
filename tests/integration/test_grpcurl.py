"""The real grpcurl binary against a running server: reflection (list, describe), calls
without any .proto at hand, a Session fed from stdin, and health."""

from __future__ import annotations

import json

from .conftest import ServerProcess, grpcurl, json_stream

SERVICE = "nib.v1.CompletionService"


def test_list_and_describe(fast_server: ServerProcess) -> None:
    listed = grpcurl("-plaintext", fast_server.address, "list")
    assert listed.returncode == 0, listed.stderr
    services = set(listed.stdout.split())
    assert {
        SERVICE,
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
    } <= services

    methods = grpcurl("-plaintext", fast_server.address, "list", SERVICE)
    assert set(methods.stdout.split()) == {
        f"{SERVICE}.Complete",
        f"{SERVICE}.GetModelInfo",
        f"{SERVICE}.GetHealthDetail",
        f"{SERVICE}.Session",
    }
    described = grpcurl("-plaintext", fast_server.address, "describe", SERVICE)
    assert described.returncode == 0, described.stderr
    assert (
        "rpc Session ( stream .nib.v1.SessionRequest ) returns ( stream .nib.v1.SessionResponse )"
        in described.stdout
    )
    message = grpcurl("-plaintext", fast_server.address, "describe", "nib.v1.CompleteRequest")
    assert "bool logprobs = 9;" in message.stdout
    assert "optional uint64 seed = 7;" in message.stdout


def test_complete_call_with_logprobs(fast_server: ServerProcess) -> None:
    body = {"prompt": "def f(", "max_tokens": 6, "logprobs": True, "request_id": "curl-1"}
    out = grpcurl("-plaintext", "-d", json.dumps(body), fast_server.address, f"{SERVICE}/Complete")
    assert out.returncode == 0, out.stderr
    messages = json_stream(out.stdout)
    assert all(m["request_id"] == "curl-1" for m in messages)
    deltas = [m["delta"] for m in messages if "delta" in m]
    dones = [m["done"] for m in messages if "done" in m]
    assert len(dones) == 1 and messages[-1].get("done") is dones[0]
    done = dones[0]
    ids = [i for d in deltas for i in d.get("token_ids", [])]
    logprobs = [p for d in deltas for p in d.get("logprobs", [])]
    assert len(ids) == len(logprobs) == done["usage"]["completion_tokens"]
    assert all(p <= 0.0 for p in logprobs)
    assert done["finish_reason"] in ("FINISH_REASON_LENGTH", "FINISH_REASON_END_OF_TEXT")
    assert done["timings"]["ttft_ms"] > 0
    assert len(done["timings"].get("inter_token_ms", [])) == len(ids) - 1


def test_session_fed_from_stdin(fast_server: ServerProcess) -> None:
    """Two starts, an empty message and a cancel of an unknown id, all on one stream: the
    second start supersedes the first, the empty one is rejected, the session lives on
    and ends OK when stdin closes."""
    lines = [
        {"start": {"prompt": "a", "max_tokens": 400, "request_id": "one"}},
        {"start": {"prompt": "b", "max_tokens": 4, "request_id": "two"}},
        {},
        {"cancel": {"request_id": "nobody"}},
    ]
    stdin = "\n".join(json.dumps(line) for line in lines)
    out = grpcurl("-plaintext", "-d", "@", fast_server.address, f"{SERVICE}/Session", stdin=stdin)
    assert out.returncode == 0, out.stderr
    dones = {m.get("request_id", ""): m["done"] for m in json_stream(out.stdout) if "done" in m}
    assert dones["one"]["finish_reason"] == "FINISH_REASON_SUPERSEDED"
    assert dones["two"]["finish_reason"] in ("FINISH_REASON_LENGTH", "FINISH_REASON_END_OF_TEXT")
    assert dones[""]["finish_reason"] == "FINISH_REASON_ERROR"
    assert dones[""]["error_code"] == 3 and dones[""]["error"].startswith("action:")


def test_bad_input_status_names_the_field(fast_server: ServerProcess) -> None:
    out = grpcurl(
        "-plaintext",
        "-d",
        json.dumps({"prompt": "x", "temperature": 7}),
        fast_server.address,
        f"{SERVICE}/Complete",
    )
    assert out.returncode != 0
    assert "Code: InvalidArgument" in out.stderr
    assert "temperature: is 7.0; must be between 0 and 2" in out.stderr


def test_model_info_and_health(fast_server: ServerProcess) -> None:
    out = grpcurl("-plaintext", fast_server.address, f"{SERVICE}/GetModelInfo")
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert info["context_length"] == 512 and info["device"] == "cpu"
    assert info["quantization"] == "none" and info["supports_infill"] is True
    assert info["max_tokens_limit"] == 1024 and info["server_version"]
    # Drafting is on by default on the CPU, with no measured verify costs there.
    assert info["speculation"] == {"draft_tokens": 6}
    for service in ("", SERVICE):
        health = grpcurl(
            "-plaintext",
            "-d",
            json.dumps({"service": service}),
            fast_server.address,
            "grpc.health.v1.Health/Check",
        )
        assert json.loads(health.stdout) == {"status": "SERVING"}
