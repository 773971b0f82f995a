"""bench/cuda_variants.py's choices without a GPU: the variants it offers by default,
and the clear refusal of one that is not an experiment in the sources."""

from __future__ import annotations

from pathlib import Path

import pytest

from nib.engine.cuda import loader

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def cv(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import cuda_variants

    return cuda_variants


def test_the_default_is_plain_each_experiment_and_all_together(cv, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    names = sorted(loader.EXPERIMENTS)
    together = ["+".join(names)] if len(names) > 1 else []
    assert cv.default_variants() == ["plain", *names, *together]
    assert cv.parse_variant("plain") == ()
    if names:
        assert cv.parse_variant("+".join(names)) == tuple(names)
    # Two experiments: each alone, then both together.
    monkeypatch.setattr(loader, "EXPERIMENTS", {"NIB_B": "b", "NIB_A": "a"})
    assert cv.default_variants() == ["plain", "NIB_A", "NIB_B", "NIB_A+NIB_B"]
    assert cv.parse_variant("NIB_A+NIB_B") == ("NIB_A", "NIB_B")


@pytest.mark.parametrize("bad", ["NIB_NOT_AN_EXPERIMENT", "NDEBUG", "NIB_ATTN_PUSH+junk"])
def test_a_variant_that_is_not_an_experiment_is_refused(cv, bad: str, capsys) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="--variants"):
        cv.parse_variant(bad)
    with pytest.raises(SystemExit) as info:
        cv.main(["--variants", bad])
    assert info.value.code == 2
    assert "--variants" in capsys.readouterr().err


def test_bad_rounds_and_formats_are_refused(cv, capsys) -> None:  # type: ignore[no-untyped-def]
    for argv, what in ((["--rounds", "0"], "--rounds"), (["--formats", "fp8"], "--formats")):
        with pytest.raises(SystemExit) as info:
            cv.main(argv)
        assert info.value.code == 2
        assert what in capsys.readouterr().err


def test_a_config_variant_names_layer_configs_on_the_plain_build(cv) -> None:  # type: ignore[no-untyped-def]
    v = "cfg:int4 1536x8960 +residual=int4 mma16 r1w16p4;int4 2048x1536 +norm=int4 mma16 r1w8p4"
    assert cv.parse_variant(v) == ()
    assert cv.config_choices(v) == [
        "int4 1536x8960 +residual=int4 mma16 r1w16p4",
        "int4 2048x1536 +norm=int4 mma16 r1w8p4",
    ]
    assert cv.config_choices("plain") == [] and cv.config_choices("NIB_A+NIB_B") == []


@pytest.mark.parametrize("bad", ["cfg:", "cfg:no equals sign", "cfg:a=b;junk"])
def test_a_config_variant_without_knob_and_label_is_refused(cv, bad: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="cfg:KNOB=LABEL"):
        cv.parse_variant(bad)
