"""The SDK, the CLI and the bridge against a real server that wants TLS and an API key
(`nib serve --tls-cert --tls-key --api-key-file`)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_lsp
from lsprotocol import types
from pytest_lsp import LanguageClient

from nib.sdk import AsyncClient, Client, RetryPolicy, Unauthenticated, Unavailable

from .certs import Pki, make_pki
from .conftest import ServerProcess, start_server, stop_server
from .lsp_helpers import BRIDGE_CONFIG, bridge_status, initialize, inline_text, open_document

KEY = "acme-0123456789abcdef"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def key_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("key") / "api-key"
    path.write_text(KEY + "\n")
    return path


@pytest.fixture(scope="module")
def secure(
    random_model_dir: Path, pki: Pki, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    folder = tmp_path_factory.mktemp("secure-sdk")
    keys = folder / "keys.txt"
    keys.write_text(f"acme:{KEY}\n")
    proc = start_server(
        random_model_dir,
        folder / "server.log",
        "--api-key-file",
        str(keys),
        "--tls-cert",
        str(pki.server_cert),
        "--tls-key",
        str(pki.server_key),
        health_client=lambda address: Client(address, ca_file=pki.ca),
    )
    yield proc
    stop_server(proc)


def test_sdk_with_ca_file_and_api_key(secure: ServerProcess, pki: Pki) -> None:
    with Client(secure.address, ca_file=pki.ca, api_key=KEY) as client:
        assert client.complete("x", max_tokens=3).result().usage.completion_tokens == 3
        with client.session() as session:
            assert session.complete(prefix="a", suffix="b", max_tokens=2).result().text
        assert client.model_info().context_length > 0


def test_wrong_or_missing_key_is_unauthenticated_with_the_servers_words(
    secure: ServerProcess, pki: Pki
) -> None:
    for key, words in ((None, "missing API key"), ("wrong-0123456789abcdef", "invalid API key")):
        with Client(secure.address, ca_file=pki.ca, api_key=key) as client:
            stream = client.complete("x", max_tokens=3)
            with pytest.raises(Unauthenticated) as info:
                stream.result()
            assert info.value.message.startswith(words)
            assert stream.attempts == 1, "only UNAVAILABLE is retried"
            with pytest.raises(Unauthenticated):
                client.session().complete("x", max_tokens=3).result()
            assert client.health() == "SERVING"  # health needs no key


def test_plain_text_client_cannot_talk_to_the_tls_port(secure: ServerProcess) -> None:
    quick = RetryPolicy(max_attempts=1)
    with (
        Client(secure.address, api_key=KEY, retry=quick, timeout=10) as client,
        pytest.raises(Unavailable),
    ):
        client.complete("x", max_tokens=3).result()


async def test_async_client_with_tls_and_key(secure: ServerProcess, pki: Pki) -> None:
    async with AsyncClient(secure.address, ca_file=pki.ca, api_key=KEY) as client:
        result = await client.complete("x", max_tokens=3).result()
        assert result.usage.completion_tokens == 3
        async with client.session() as session:
            assert (await session.complete("y", max_tokens=2).result()).finish_reason


def test_cli_with_ca_file_and_key_file(secure: ServerProcess, pki: Pki, key_file: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("NIB_API_KEY", "NIB_ADDRESS")}
    base = [sys.executable, "-m", "nib.sdk.cli"]
    tls = ["--address", secure.address, "--ca-file", str(pki.ca)]
    run = subprocess.run(
        [*base, "complete", "x", "--max-tokens", "3", "--api-key-file", str(key_file), *tls],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    refused = subprocess.run(
        [*base, "complete", "x", *tls], capture_output=True, text=True, env=env, timeout=60
    )
    assert refused.returncode == 1 and "UNAUTHENTICATED: missing API key" in refused.stderr
    keyed = subprocess.run(
        [*base, "complete", "x", "--max-tokens", "2", *tls],
        capture_output=True,
        text=True,
        env={**env, "NIB_API_KEY": KEY},
        timeout=60,
    )
    assert keyed.returncode == 0, keyed.stderr


@pytest_lsp.fixture(config=BRIDGE_CONFIG)
async def lsp(lsp_client: LanguageClient) -> AsyncIterator[None]:
    yield
    await lsp_client.shutdown_session()


async def test_bridge_with_tls_and_key_and_a_refused_key(
    lsp: LanguageClient, secure: ServerProcess, pki: Pki, tmp_path: Path
) -> None:
    options = {
        "address": secure.address,
        "caFile": str(pki.ca),
        "apiKey": "wrong-0123456789abcdef",
        "debounceMs": 0,
        "maxTokens": 4,
        "mode": "single",
    }
    await initialize(lsp, tmp_path.as_uri(), options)
    uri = (tmp_path / "a.py").as_uri()
    open_document(lsp, uri, "def f():\n    return 1\n")
    at = types.Position(line=1, character=12)
    assert await inline_text(lsp, uri, at) is None
    for _ in range(250):
        if lsp.messages:
            break
        await asyncio.sleep(0.02)
    (refused,) = lsp.messages
    assert refused.type == types.MessageType.Error and "refused the API key" in refused.message
    lsp.workspace_did_change_configuration(
        types.DidChangeConfigurationParams(settings={"nib": {"apiKey": KEY}})
    )
    for _ in range(100):
        await inline_text(lsp, uri, at)  # this small model may well answer blank here
        status = await bridge_status(lsp)
        if status["reachable"]:
            break
        await asyncio.sleep(0.05)
    assert status["reachable"] is True and status["completed"] >= 1
