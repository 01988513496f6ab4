"""An RMSNorm run as eager tensor ops (the bundled trainer's) costs the passes it makes beyond a
fused kernel: the layer's op list, and where the trainer's predictions turn it on."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import make_inputs

from autoconfig.cost.layer import EAGER_NORM_BYTES, FUSED_NORM_PASSES, head_ops, layer_ops
from autoconfig.cost.timing import kernel_count
from autoconfig.trainer.config import TrainConfig
from autoconfig.trainer.prediction import training_inputs_of_runs


def _eager(model: str, **columns: float) -> tuple[float, float, float]:
    """Forward bytes per token the eager norms of one layer and the head add, the backward
    bytes, and the extra forward launches."""
    x = make_inputs(model, "h100-sxm-80gb", **columns)
    ops = [op for op in [*layer_ops(x), *head_ops(x)] if "_eager_" in op.name]
    forward = sum(float(np.asarray(op.moved)) for op in ops)
    backward = sum(float(np.asarray(op.moved)) * op.bwd_factor for op in ops)
    return forward, backward, float(kernel_count(ops))


@pytest.mark.parametrize("autocast, element", [(1.0, 4.0), (0.0, 2.0)])
def test_a_llama_layers_eager_norms_add_their_passes(autocast: float, element: float) -> None:
    hidden = 4096.0  # llama3-8b: two norms a layer, and the final norm with the head
    forward, backward, launches = _eager("llama3-8b", eager_rmsnorm=1.0, autocast_fp32=autocast)
    eager_f, eager_b = EAGER_NORM_BYTES[element]
    assert forward == pytest.approx(3 * (eager_f - FUSED_NORM_PASSES[0] * element) * hidden)
    assert backward == pytest.approx(3 * (eager_b - FUSED_NORM_PASSES[1] * element) * hidden)
    assert launches > 0
    # under autocast: 5 more passes of 4 bytes forward, 15 backward
    if autocast:
        assert forward == pytest.approx(3 * 5 * 4 * hidden)
        assert backward == pytest.approx(3 * 15 * 4 * hidden)


def test_nothing_is_added_for_fused_norms_layernorm_or_when_off() -> None:
    assert _eager("llama3-8b", eager_rmsnorm=0.0, autocast_fp32=1.0) == (0.0, 0.0, 0.0)
    assert _eager("gpt3-1.3b", eager_rmsnorm=1.0, autocast_fp32=1.0) == (0.0, 0.0, 0.0)


def test_sequence_parallelism_splits_the_eager_passes_over_tp() -> None:
    plain = _eager("llama3-8b", eager_rmsnorm=1.0, autocast_fp32=1.0, tp=4.0, sp=0.0)
    split = _eager("llama3-8b", eager_rmsnorm=1.0, autocast_fp32=1.0, tp=4.0, sp=1.0)
    assert split[0] == pytest.approx(plain[0] / 4)
    assert split[1] == pytest.approx(plain[1] / 4)


def test_the_trainers_runs_turn_it_on_except_compiled_and_pay_no_step_overhead_on_gpu() -> None:
    eager = TrainConfig.model_validate({"model": "tiny-llama", "mbs": 1, "gbs": 2})
    compiled = eager.model_copy(update={"compile": True})
    x = training_inputs_of_runs(
        [eager, compiled, eager], ["h100-sxm-80gb"] * 2 + ["cpu-gloo"], ["cuda", "cuda", "cpu"]
    )
    assert list(np.asarray(x.eager_rmsnorm)) == [1.0, 0.0, 1.0]
    # a GPU step's fixed cost is its optimizer's (measured); CPU ranks keep cpu-gloo's overhead
    assert list(np.asarray(x.profile_step_overhead)) == [0.0, 0.0, 1.0]
