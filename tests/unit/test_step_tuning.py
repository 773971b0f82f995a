"""engine/step_tuning.py's coordinate descent, on a made-up cost (no GPU): it keeps the
fastest option of each knob, holds on to the current one within the noise margin,
and leaves every knob applied at its choice."""

from __future__ import annotations

from nib.engine.step_tuning import NOISE, Knob, descend


def _knobs(state: dict[str, object], options: dict[str, list[object]]) -> list[Knob]:
    def setter(name: str):  # type: ignore[no-untyped-def]
        return lambda v: state.__setitem__(name, v)

    return [Knob(name, opts, setter(name), str) for name, opts in options.items()]


def test_each_knob_keeps_its_fastest_option() -> None:
    state: dict[str, object] = {}
    knobs = _knobs(state, {"a": [1, 2, 3], "b": ["x", "y"]})
    cost = {1: 100.0, 2: 80.0, 3: 90.0}

    def measure() -> float:
        return cost[state["a"]] + (5.0 if state.get("b", "x") == "x" else 0.0)  # type: ignore[index]

    descend(knobs, measure)
    assert state == {"a": 2, "b": "y"}
    assert [k.chosen for k in knobs] == [1, 1]
    assert knobs[0].times_us == [105.0, 85.0, 95.0]


def test_a_gain_within_the_noise_keeps_the_current_option() -> None:
    state: dict[str, object] = {}
    (knob,) = _knobs(state, {"a": ["now", "other"]})
    times = {"now": 100.0, "other": 100.0 * (1 - NOISE / 2)}
    descend([knob], lambda: times[state["a"]])  # type: ignore[index]
    assert state["a"] == "now" and knob.chosen == 0
    times["other"] = 100.0 * (1 - 2 * NOISE)
    descend([knob], lambda: times[state["a"]])  # type: ignore[index]
    assert state["a"] == "other" and knob.chosen == 1


def test_a_whole_that_ends_slower_goes_back_to_where_it_started() -> None:
    """Each option is timed once: noise can pick a loser. If the step then measures
    slower than before by more than NOISE, every knob returns to its first option."""
    from nib.engine.step_tuning import tune

    state: dict[str, object] = {"a": "now"}
    (knob,) = _knobs(state, {"a": ["now", "other"]})
    # before, then the trial of "now", then "other" (looks faster), then the check
    # (slower than before), then the re-measure after the revert.
    readings = iter([100.0, 100.0, 90.0, 105.0, 100.5])
    first, last, reverted = tune([knob], lambda: next(readings), passes=1)
    assert (first, last, reverted) == (100.0, 100.5, True)
    assert state["a"] == "now" and knob.chosen == 0


def test_a_whole_that_ends_faster_keeps_its_choices() -> None:
    from nib.engine.step_tuning import tune

    state: dict[str, object] = {"a": "now"}
    (knob,) = _knobs(state, {"a": ["now", "other"]})
    readings = iter([100.0, 100.0, 90.0, 91.0])
    assert tune([knob], lambda: next(readings), passes=1) == (100.0, 91.0, False)
    assert state["a"] == "other" and knob.chosen == 1


def test_a_second_pass_holds_on_to_the_first_pass_choice_within_the_noise() -> None:
    state: dict[str, object] = {}
    (knob,) = _knobs(state, {"a": ["first", "second"]})
    times = {"first": 100.0, "second": 90.0}
    descend([knob], lambda: times[state["a"]])  # type: ignore[index]
    assert knob.chosen == 1
    times["first"] = 90.0 * (1 - NOISE / 2)  # now a hair faster, within the noise
    descend([knob], lambda: times[state["a"]])  # type: ignore[index]
    assert state["a"] == "second" and knob.chosen == 1


def test_the_pick_knob_is_offered_only_where_the_pick_can_be_fused() -> None:
    from types import SimpleNamespace

    from nib.engine.step_tuning import _pick_knob

    runner = SimpleNamespace(fuse_pick=False, tune_pick=True, pick_fusable=lambda: True)
    (knob,) = _pick_knob(runner)
    assert knob.options == [False, True]  # the current place first: the default to beat
    knob.apply(True)
    assert runner.fuse_pick is True
    assert [knob.label(o) for o in knob.options] == ["separate kernel", "fused into the lm_head"]
    off = SimpleNamespace(fuse_pick=False, tune_pick=True, pick_fusable=lambda: False)
    assert _pick_knob(off) == []
    assert _pick_knob(SimpleNamespace(fuse_pick=False)) == []  # a runner without the pick
    # Not asked for (the default: on the H200 the fused pick measured slower).
    assert (
        _pick_knob(SimpleNamespace(fuse_pick=False, tune_pick=False, pick_fusable=lambda: True))
        == []
    )
