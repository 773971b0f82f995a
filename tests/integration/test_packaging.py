"""The built wheel installs alone (no torch) and its SDK and CLI talk to a real server."""

from __future__ import annotations

import json
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from .conftest import ServerProcess

ROOT = Path(__file__).resolve().parents[2]


def frame(message: dict[str, object]) -> bytes:
    body = json.dumps(message).encode()
    return b"Content-Length: %d\r\n\r\n%s" % (len(body), body)


def lsp_handshake(nib: Path) -> str:
    """Start `nib lsp`, send initialize, shutdown and exit; return the initialize answer."""
    messages = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"capabilities": {}}},
        {"jsonrpc": "2.0", "method": "initialized", "params": {}},
        {"jsonrpc": "2.0", "id": 2, "method": "shutdown"},
        {"jsonrpc": "2.0", "method": "exit"},
    ]
    run = subprocess.run(
        [str(nib), "lsp", "--address", "127.0.0.1:1"],
        input=b"".join(frame(m) for m in messages),
        capture_output=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr.decode()
    return run.stdout.decode()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "build",
            "--wheel",
            "--no-isolation",
            "--outdir",
            str(out),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
        timeout=600,
    )
    (built,) = out.glob("nib-*.whl")
    return built


def test_wheel_contains_every_package_and_generated_stubs(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for required in (
        "nib/v1/completion_pb2.py",
        "nib/v1/completion_pb2_grpc.py",
        "nib/v1/completion.proto",
        "nib/sdk/client.py",
        "nib/sdk/py.typed",
        "nib/sdk/aio_client.py",
        "nib/bridge/server.py",
        "nib/engine/model.py",
        "nib/service/server.py",
        "nib/bridge/__init__.py",
    ):
        assert required in names, required
    assert not any(n.startswith("nib/__init__") for n in names), "nib is a namespace package"


def test_base_install_has_no_torch_and_the_sdk_works(
    wheel: Path, server: ServerProcess, tmp_path: Path
) -> None:
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    subprocess.run(
        [str(py), "-m", "pip", "install", "--quiet", str(wheel)],
        check=True,
        timeout=600,
        capture_output=True,
    )
    probe = (
        "import asyncio, importlib.util, sys\n"
        "import nib.sdk, nib.sdk.cli, nib.v1.completion_pb2, nib.bridge.server\n"
        "assert importlib.util.find_spec('torch') is None, 'torch is installed'\n"
        "assert 'torch' not in sys.modules\n"
        f"c = nib.sdk.Client('{server.address}')\n"
        "s = c.complete('def f', max_tokens=4)\n"
        "print(repr(''.join(s)), s.finish_reason)\n"
        "async def main():\n"
        f"    async with nib.sdk.AsyncClient('{server.address}') as a:\n"
        "        r = await a.session().complete(prefix='a', suffix='b', max_tokens=2).result()\n"
        "        print(r.finish_reason)\n"
        "asyncio.run(main())\n"
        "assert 'torch' not in sys.modules\n"
    )
    run = subprocess.run([str(py), "-c", probe], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    first, second = run.stdout.splitlines()[-2:]
    assert first.split()[-1] in ("length", "end_of_text") and second in ("length", "end_of_text")
    health = subprocess.run(
        [str(env_dir / "bin" / "nib"), "health", "--address", server.address],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert health.returncode == 0 and health.stdout.strip() == "SERVING", health.stderr
    assert "inlineCompletionProvider" in lsp_handshake(env_dir / "bin" / "nib")
    serve = subprocess.run(
        [str(env_dir / "bin" / "nib"), "serve"], capture_output=True, text=True, timeout=60
    )
    assert serve.returncode == 2 and "pip install 'nib[server]'" in serve.stderr
