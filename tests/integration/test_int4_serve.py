"""`nib serve --quant int4` end to end: INT4 weights behind the real server and SDK."""

from __future__ import annotations

from pathlib import Path

import pytest

from nib.sdk import Client

from .conftest import start_server, stop_server


@pytest.mark.parametrize("how", ["rtn", "gptq"])
def test_int4_server_reports_quantisation_and_completes(
    random_model_dir: Path, tmp_path: Path, how: str
) -> None:
    if how == "rtn":
        model, extra, expected = random_model_dir, ("--quant", "int4"), "int4-g128-rtn"
    else:
        from nib.sdk.cli import main

        model = tmp_path / "gptq"
        argv = ["quantize", "--model", str(random_model_dir), "--out", str(model)]
        assert main([*argv, "--samples", "2", "--seq-len", "64", "--device", "cpu"]) == 0
        extra, expected = (), "int4-g128-gptq"  # auto: served as the checkpoint is
    server = start_server(model, tmp_path / "server.log", "--device", "cpu", *extra)
    try:
        with Client(server.address) as client:
            assert client.model_info().quantization == expected
            stream = client.complete("def fib(n):", max_tokens=8)
            text = "".join(stream)
            assert stream.usage.completion_tokens > 0 or stream.finish_reason == "end_of_text"
            assert isinstance(text, str)
    finally:
        stop_server(server)
