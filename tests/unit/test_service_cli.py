"""`nib serve` refuses inconsistent security flags before loading anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from nib.service.cli import main


def test_tls_flags_go_together(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cert = tmp_path / "c.pem"
    cert.write_text("x")
    with pytest.raises(SystemExit) as info:
        main(["--tls-cert", str(cert)])
    assert info.value.code == 2
    assert "--tls-cert and --tls-key go together" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--tls-client-ca", str(cert)])
    assert "--tls-client-ca needs --tls-cert" in capsys.readouterr().err


def test_bad_key_file_names_the_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    keys = tmp_path / "keys"
    keys.write_text("acme:0123456789abcdef0123\nbroken line with a secret-ish-value\n")
    with pytest.raises(SystemExit) as info:
        main(["--api-key-file", str(keys)])
    err = capsys.readouterr().err
    assert info.value.code == 2
    assert f"{keys} line 2: expected tenant:key" in err
    assert "secret-ish-value" not in err and "0123456789abcdef0123" not in err
    with pytest.raises(SystemExit):
        main(["--api-key-file", str(tmp_path / "missing")])
    assert "No such file" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--max-queue", "0", "--max-queue is 0; must be at least 1"),
        ("--speculative-k", "-1", "--speculative-k is -1; must be 0 to 7"),
        ("--speculative-k", "8", "--speculative-k is 8; must be 0 to 7"),
        ("--max-message-bytes", "10", "--max-message-bytes is 10; must be at least 1024"),
        ("--grace", "-1", "--grace is -1.0; must be at least 0"),
        ("--telemetry-interval", "-1", "--telemetry-interval is -1.0; must be at least 0"),
        ("--telemetry-interval", "nan", "--telemetry-interval is nan; must be a number"),
        (
            "--fragmentation-threshold",
            "1.5",
            "--fragmentation-threshold is 1.5; must be in (0, 1]",
        ),
    ],
)
def test_limits_are_checked(
    flag: str, value: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main([flag, value])
    assert message in capsys.readouterr().err


def test_speculative_k_reaches_the_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    import nib.service.cli as cli

    seen = []

    async def fake_serve(config) -> None:  # type: ignore[no-untyped-def]
        seen.append(config.engine.speculative_k)

    monkeypatch.setattr(cli, "serve", fake_serve)
    assert main(["--device", "cpu", "--speculative-k", "0"]) == 0
    assert main(["--device", "cpu", "--speculative-k", "7"]) == 0
    assert main(["--device", "cpu"]) == 0
    assert seen == [0, 7, None]  # None: the engine's device default
