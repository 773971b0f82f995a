"""Retries against a real server that is not there yet, and one that dies mid-completion."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from nib.sdk import Client, Completion, RetryPolicy, Unavailable

from .conftest import free_port, start_server, stop_server


def test_retry_waits_for_the_server_but_never_repeats_after_a_token(
    slow_model_dir: Path, tmp_path: Path
) -> None:
    port = free_port()
    address = f"127.0.0.1:{port}"
    # Generous: the server needs seconds to import torch and load the model.
    patient = RetryPolicy(max_attempts=200, initial_backoff_s=0.1, max_backoff_s=0.5)
    outcome: dict[str, Completion | BaseException] = {}
    attempts: list[int] = []

    def early_caller() -> None:
        try:
            with Client(address, retry=patient) as client:
                stream = client.complete("x", max_tokens=3)
                outcome["result"] = stream.result()
                attempts.append(stream.attempts)
        except BaseException as exc:
            outcome["result"] = exc

    caller = threading.Thread(target=early_caller)
    caller.start()
    time.sleep(0.5)  # the caller is now retrying against a closed port
    server = start_server(slow_model_dir, tmp_path / "server.log", port=port)
    try:
        caller.join(60)
        result = outcome["result"]
        assert isinstance(result, Completion), result
        assert result.finish_reason in ("length", "end_of_text")
        assert attempts[0] > 1, "the first attempts met a closed port"

        with Client(address, retry=patient) as client:
            stream = client.complete("x", max_tokens=1000, temperature=1.0, seed=1)
            it = iter(stream)
            next(it)
            server.process.kill()
            with pytest.raises(Unavailable):
                list(it)
        assert stream.attempts == 1, "a completion that had tokens must not be retried"
    finally:
        stop_server(server)
