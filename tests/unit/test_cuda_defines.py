"""Experiment defines for nib's CUDA modules (engine/cuda/loader.py): what is accepted,
the flags they become, and objects holding a module switching after set_defines().
No GPU: module() is replaced by a stand-in that records the flags it was built with."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from nib.engine.cuda import loader


@pytest.fixture(autouse=True)
def fresh_defines(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("NIB_CUDA_DEFINES", raising=False)
    monkeypatch.delenv("NIB_CUDA_TRACE", raising=False)
    monkeypatch.setattr(loader, "_defines", None)
    yield
    loader._defines = None  # the next reader goes back to the environment


def test_no_defines_by_default() -> None:
    assert loader.defines() == ()
    assert loader.build_flags() == ()


def test_defines_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NIB_CUDA_DEFINES", " NIB_ATTN_PUSH, NIB_SPLITS=4 ,")
    monkeypatch.setenv("NIB_CUDA_TRACE", "1")
    assert loader.defines() == ("NIB_ATTN_PUSH", "NIB_SPLITS=4")
    assert loader.build_flags() == ("-DNIB_TRACE", "-DNIB_ATTN_PUSH", "-DNIB_SPLITS=4")


@pytest.mark.parametrize(
    "bad", ["NDEBUG", "nib_norm_early", "NIB_", "NIB_A=$(id)", "NIB_A B", "-DNIB_A", "NIB_A="]
)
def test_anything_but_a_nib_define_is_refused_naming_the_variable(
    bad: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NIB_CUDA_DEFINES", bad)
    with pytest.raises(ValueError, match="NIB_CUDA_DEFINES") as info:
        loader.defines()
    assert repr(bad.strip()) in str(info.value) or "NIB_<NAME>" in str(info.value)


def test_the_trace_keeps_its_own_switch() -> None:
    with pytest.raises(ValueError, match="NIB_CUDA_TRACE=1"):
        loader.set_defines(["NIB_TRACE"])


def test_set_defines_moves_bound_modules_at_their_next_use(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    built: list[tuple[str, tuple[str, ...]]] = []

    def fake_module(source: str, device: torch.device) -> object:
        built.append((source, loader.build_flags()))
        return built[-1]

    monkeypatch.setattr(loader, "module", fake_module)
    bound = loader.Bound("w4a16.cu", torch.device("cpu"))
    assert bound.get() == ("w4a16.cu", ())
    assert bound.get() is bound.get() and len(built) == 1  # looked up once
    loader.set_defines(["NIB_ATTN_PUSH"])
    assert bound.get() == ("w4a16.cu", ("-DNIB_ATTN_PUSH",))
    assert len(built) == 2
    loader.set_defines([])
    assert bound.get() == ("w4a16.cu", ()) and len(built) == 3
    with pytest.raises(ValueError, match="set_defines"):
        loader.set_defines(["oops"])
    assert loader.defines() == ()  # a refused change changes nothing


def test_every_experiment_says_what_it_changes() -> None:
    for name, what in loader.EXPERIMENTS.items():
        assert loader.parse_defines(name) == (name,)
        assert len(what) > 20
