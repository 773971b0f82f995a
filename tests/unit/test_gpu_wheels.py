"""tools/gpu_wheels.py: what a GPU run carries to the host in .whl/."""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("gpu_wheels", ROOT / "tools" / "gpu_wheels.py")
gpu_wheels = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_wheels)


def test_every_runtime_dependency_is_carried_or_on_the_host():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specs = project["dependencies"] + [
        s for extra in gpu_wheels.EXTRAS for s in project["optional-dependencies"][extra]
    ]
    carry = gpu_wheels.to_carry()
    for spec in specs:
        name, _ = gpu_wheels._requirement_name(spec)
        assert (name in carry) != (name in gpu_wheels.HOST_HAS), name


def test_what_is_carried_is_the_installed_version_and_what_it_needs():
    carry = gpu_wheels.to_carry()
    assert {"grpcio", "protobuf", "structlog", "pygls"} <= carry.keys()
    # needed only through other packages: grpcio-status and lsprotocol
    assert {"googleapis-common-protos", "cattrs"} <= carry.keys()
    assert not carry.keys() & gpu_wheels.HOST_HAS
    for name, version in carry.items():
        assert md.version(name) == version


def test_requirement_lines_are_parsed_with_their_extra():
    parse = gpu_wheels._requirement_name
    assert parse("grpcio>=1.85.1") == ("grpcio", None)
    assert parse("Typing_Extensions (>=4.0)") == ("typing-extensions", None)
    assert parse('torch>=2.6; extra == "server"') == ("torch", "server")
    assert not gpu_wheels._applies('pywin32; sys_platform == "win32"')
    assert gpu_wheels._applies("grpcio>=1.85.1")


def test_other_versions_are_removed_and_the_download_is_pinned(tmp_path, monkeypatch):
    carry = gpu_wheels.to_carry()
    stale = tmp_path / "grpcio-0.0.1-cp312-cp312-manylinux2014_x86_64.whl"
    current = tmp_path / f"grpcio-{carry['grpcio']}-cp312-cp312-manylinux2014_x86_64.whl"
    other = tmp_path / "somethingelse-1.0-py3-none-any.whl"
    for p in (stale, current, other):
        p.write_bytes(b"")
    calls = []

    def fake_run(cmd, check):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(gpu_wheels.subprocess, "run", fake_run)
    assert gpu_wheels.main(["--dest", str(tmp_path)]) == 0
    assert not stale.exists() and current.exists() and other.exists()
    (cmd,) = calls
    assert cmd[:4] == [sys.executable, "-m", "pip", "download"]
    assert "--no-deps" in cmd and "3.12" in cmd
    assert f"grpcio=={carry['grpcio']}" in cmd
    assert not any(a.startswith("torch==") for a in cmd)
