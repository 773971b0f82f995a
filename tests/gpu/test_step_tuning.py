"""Start-up's decode-step tuning on the GPU (engine/step_tuning.py): it runs when kernels
are tuned, picks among the options it offers, never leaves the step slower than it
found it (beyond timing noise), and the tuned graph path still equals the same
kernels run eagerly, token for token; the self-check passed on the final choice."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from nib.engine.engine import Engine, EngineConfig
from nib.engine.selfcheck import SelfCheckStatus

from .models import save_random_hf_model

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("quant", ["none", "int4"])
def test_tuned_start_up_keeps_the_step_correct(quant: str, tmp_path: Path) -> None:
    from nib.engine.cuda.loader import unavailable_reason

    if why := unavailable_reason(torch.device("cuda")):
        pytest.skip(why)
    model_dir = save_random_hf_model("qwen2", tmp_path / "m", hidden=1024, layers=4)
    config = EngineConfig(model_dir=model_dir, device="cuda", max_context=1024, quant=quant)
    engine = Engine(config).start()
    try:
        assert engine.wait_ready(600), engine.failure
        assert engine.selfcheck.status is SelfCheckStatus.PASSED
        runner = engine.runner
    finally:
        engine.stop()
    tuning = runner.step_tuning
    assert engine.step_choices == tuning["chosen"] and engine.step_choices
    assert tuning["after_us"] <= tuning["before_us"] * 1.05, tuning
    prompt = list(b"def fibonacci(n):\n    if n < 2:\n        return n\n") * 2
    graphed = [t for t, _ in runner.generate(prompt, True, 48)]
    assert runner.graphs, "the tuned runner captured no graphs"
    runner.graphs.clear()  # the same bodies, eagerly: same kernels, same configs
    eager = [t for t, _ in runner.generate(prompt, True, 48)]
    assert graphed == eager
