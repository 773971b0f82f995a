"""bench/wire.py on the CPU: it times tokens, not text, so a model none of whose tokens
decodes to text (as random weights can do) is still measured; and a model that gives
no gap to time makes it fail with a message and exit 1, not crash."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest
from safetensors.torch import load_file, save_file

from nib.engine.default_model import make_random_model

from .conftest import free_port

ROOT = Path(__file__).resolve().parents[2]
BYTE_FF = 255  # a byte token that is never valid UTF-8 however often it repeats
END_OF_TEXT = 256


@pytest.fixture(scope="module")
def wire() -> ModuleType:
    spec = importlib.util.spec_from_file_location("wire_bench", ROOT / "bench" / "wire.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["wire_bench"] = module
    spec.loader.exec_module(module)
    return module


def rigged_model(out: Path, favourite: int) -> Path:
    """A tiny random byte-level model that picks `favourite` after whatever it reads:
    attention and MLP add nothing, and one embedding column lifts that token far above
    the others (the embeddings are tied)."""
    make_random_model(
        out, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2
    )
    tensors = load_file(str(out / "model.safetensors"))
    for name, tensor in tensors.items():
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            tensor.zero_()
    embed = tensors["model.embed_tokens.weight"]
    embed[:256, 0] = 1.0
    embed[favourite, 0] = 40.0
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


NEW = 48  # enough tokens that a client behind at the start (CI: 2 cores) still times gaps


def run(wire: ModuleType, model: Path, out: Path) -> int:
    argv = ["--device", "cpu", "--model", str(model), "--new", str(NEW), "--reps", "2"]
    argv += ["--cancel-after", "4", "--cancel-reps", "2", "--port", str(free_port())]
    rc: int = wire.main([*argv, "--out", str(out)])
    return rc


@pytest.mark.slow
def test_tokens_without_text_are_timed(wire: ModuleType, tmp_path: Path) -> None:
    model = rigged_model(tmp_path / "textless", BYTE_FF)
    assert run(wire, model, tmp_path / "out") == 0
    (path,) = (tmp_path / "out").glob("*-wire.json")
    (row,) = json.loads(path.read_text())["rows"]
    assert row["shape"] == "textless" and row["device"] == "cpu"
    assert row["tokens_per_completion"] == [NEW, NEW]
    assert row["text_deltas_per_completion"] == [0, 0]  # what crashed the old bench
    assert row["client_first_text_ms_median"] is None
    # Tokens the server joined into one delta share its gap (bench/wire.py spread_gaps),
    # so a client that fell behind this fast CPU model still times every token after
    # its first delta, never as a gap of 0.
    assert row["client_inter_token_ms_median"] > 0 and row["client_ttft_ms_median"] > 0
    assert all(1 <= d <= NEW for d in row["deltas_per_completion"])
    assert row["client_ttft_ms_median"] >= row["engine_ttft_ms_median"]
    assert len(row["cancel_overrun_tokens"]) == 2 and row["cancel_missed"] == []
    assert all(
        0 <= s <= t <= u
        for s, t, u in zip(
            row["cancel_overrun_steps"],
            row["cancel_overrun_tokens"],
            row["cancel_unseen_tokens"],
            strict=True,
        )
    )
    # The engine's last token came after the cancel exactly when it made any after it.
    for made, last_ms in zip(
        row["cancel_overrun_tokens"], row["cancel_to_last_token_ms"], strict=True
    ):
        assert (made > 0) == (last_ms > 0)
    assert isinstance(row["issue_6_met"], bool)
    # The same figures on one open Session (the editors' path), measured separately.
    assert row["session_tokens_per_completion"] == [NEW, NEW]
    assert row["session_client_inter_token_ms_median"] > 0
    assert row["session_client_ttft_ms_median"] > 0
    assert row["session_client_ttft_ms_median"] >= row["session_engine_ttft_ms_median"]
    assert isinstance(row["issue_6_session_met"], bool)


@pytest.mark.slow
def test_no_gap_to_time_fails_with_a_message(
    wire: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Ends every completion at its first free choice: nothing to time between tokens.
    model = rigged_model(tmp_path / "mute", END_OF_TEXT)
    assert run(wire, model, tmp_path / "out") == 1
    err = capsys.readouterr().err
    assert "bench/wire.py: FAILED (mute, cpu): no inter-token gap to time" in err
    assert not (tmp_path / "out").exists()


def test_joined_tokens_share_their_deltas_gap(wire: ModuleType) -> None:
    # Stamps in seconds: token 1 alone, 2 and 3 joined 2 ms later, 4 alone 1 ms after.
    stamps = [0.000, 0.002, 0.002, 0.003]
    assert wire.spread_gaps(stamps) == pytest.approx([1.0, 1.0, 1.0])
    plain = [0.000, 0.001, 0.003]
    assert wire.spread_gaps(plain) == pytest.approx([1.0, 2.0])  # nothing joined
    assert wire.spread_gaps([0.5]) == [] and wire.spread_gaps([]) == []
    # Tokens that came with the first token (a client behind at the start, as CI's
    # 2-core machine was) have no gap to time: they count none, not gaps of 0.
    assert wire.spread_gaps([0.1, 0.1, 0.2]) == pytest.approx([100.0])
    behind = [0.010, 0.010, 0.010, 0.010, 0.011, 0.012]
    assert wire.spread_gaps(behind) == pytest.approx([1.0, 1.0])
    assert wire.spread_gaps([0.3, 0.3, 0.3]) == []  # every token in one delta


def test_steps_after_a_cancel_group_the_tokens_of_one_verify(wire: ModuleType) -> None:
    # Bursts of three tokens 0.01 ms apart, 2 ms per step: the boundary is half the mean gap.
    gaps = [0.01, 0.01, 2.0] * 4
    boundary = wire.step_boundary_ms([gaps])
    assert boundary == pytest.approx(0.5 * (2.02 / 3))
    times = wire.token_clock(1000.0, 5.0, gaps)  # arrival 1000 ms, first token at 1005
    assert len(times) == 13 and times[0] == 1005.0
    assert times[3] == pytest.approx(1007.02) and times[12] == pytest.approx(1013.08)
    # Tokens 0-based 3, 6, 9, 12 start steps (their gap is 2 ms).
    assert wire.made_since(times, gaps, 1006.0, boundary) == (10, 4)
    # A cancel between the tokens of one step: the rest of it counts as one step.
    assert wire.made_since(times, gaps, 1007.025, boundary) == (9, 4)
    assert wire.made_since(times, gaps, 1013.08, boundary) == (0, 0)
    assert wire.made_since(times, gaps, 0.0, boundary) == (13, 5)
    plain = [1.0] * 8
    assert wire.made_since(wire.token_clock(0.0, 1.0, plain), plain, 7.5, 0.5) == (2, 2)
    assert wire.step_boundary_ms([[], []]) == 0.0


def test_issue_6_targets(wire: ModuleType) -> None:
    row = {
        "client_inter_token_ms_median": 2.5,
        "engine_inter_token_ms_median": 2.4,
        "client_ttft_ms_median": 10.9,
        "engine_ttft_ms_median": 10.0,
        "cancel_overrun_steps_max": 2,
    }
    assert wire.issue_6(row) == []
    row |= {"client_inter_token_ms_median": 2.6, "client_ttft_ms_median": 11.1}
    row["cancel_overrun_steps_max"] = 3
    misses = wire.issue_6(row)
    assert len(misses) == 3 and "inter-token" in misses[0] and "3 more steps" in misses[2]
    # The Session path's figures come from its own keys; the cancel check is shared.
    row |= {
        "session_client_inter_token_ms_median": 2.5,
        "session_engine_inter_token_ms_median": 2.4,
    }
    row |= {"session_client_ttft_ms_median": 10.5, "session_engine_ttft_ms_median": 10.0}
    session = wire.issue_6(row, "session_")
    assert len(session) == 1 and "3 more steps" in session[0]
