"""A step of one micro-batch whose gradients are freed after each step holds the larger of its
gradients and its activations at the peak, not both (cost.memory.gradients_at_peak)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import make_inputs

from autoconfig.cost.memory import gradients_at_peak
from autoconfig.trainer.config import TrainConfig
from autoconfig.trainer.prediction import predicted

MEASURED = Path(__file__).resolve().parents[1] / "docs" / "measured"


def _held(grads: float, acts: float, **layout: float) -> float:
    columns = {"grads_freed_each_step": 1.0, "mbs": 1.0, "gbs": 1.0} | layout
    x = make_inputs("llama3-8b", "h100-sxm-80gb", **columns)
    return float(np.asarray(gradients_at_peak(x, np.float64(grads), np.float64(acts))))


def test_one_micro_batch_holds_only_the_gradients_beyond_its_activations() -> None:
    assert _held(5.0, 8.0) == 0.0
    assert _held(5.0, 3.0) == pytest.approx(2.0)


@pytest.mark.parametrize(
    "layout",
    [
        {"gbs": 2.0},  # two micro-batches: the first one's gradients wait beside the second
        {"dp": 2.0, "gbs": 2.0},  # data parallelism keeps its buckets
        {"cp": 2.0},
        {"pp": 2.0},
        {"grads_freed_each_step": 0.0},  # persistent gradient buffers (Megatron, DeepSpeed)
    ],
)
def test_every_other_step_holds_all_its_gradients(layout: dict[str, float]) -> None:
    assert _held(5.0, 8.0, **layout) == pytest.approx(5.0)


@pytest.mark.parametrize("case", ["llama3-70b slice tp8 gbs1", "gpt3-1.3b seq1024 mbs4 gbs4"])
def test_the_h200s_one_micro_batch_peaks(case: str) -> None:
    """Measured 10.94 and 27.49 GiB, 1.53 and 4.89 GiB below the same steps of two
    micro-batches; predicted within 5% (counting all gradients: 20% and 18% over)."""
    runs = json.loads((MEASURED / "h200_fixed_cost_runs.json").read_text())["runs"]
    run = next(r for r in runs if r["case"] == case)
    pred = predicted(TrainConfig.model_validate(run["config"]), "h200-sxm-141gb", "cuda")
    assert pred["pred_peak_mem_gib"] == pytest.approx(run["peak_allocated_gib"], rel=0.05)
