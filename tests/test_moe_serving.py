"""MoE serving from measured tables: the fused-MoE table covers the shipped MoE models, a
routed layer takes the table's time, the busiest expert-parallel rank's imbalance, and the
expert all-to-all from the measured NCCL table."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from autoconfig.columns.build import serving_inputs
from autoconfig.columns.kernel_catalog import kernel_chips, kernel_tables
from autoconfig.cost import serving_gemm, serving_moe
from autoconfig.cost.inference import ServeInputs, measured_all_reduce, serve_time
from autoconfig.cost.kernel_tables import collective_seconds, moe_seconds, nearest_moe_shape
from autoconfig.cost.serving_step import step_model
from autoconfig.spec import catalog

QWEN = (2048.0, 768.0, 128.0, 8.0)  # Qwen3-30B-A3B: hidden, expert FFN, experts, top-k


def inputs(model: str = "qwen3-30b-a3b", gpu: str = "h200-sxm-141gb", **cols) -> ServeInputs:
    spec, g = catalog.get_model(model), catalog.get_gpu(gpu)
    base = {
        "tp": 1.0,
        "pp": 1.0,
        "batch_size": 1.0,
        "input_len": 2048.0,
        "output_len": 512.0,
        "replicas": 1.0,
        "precision": "fp8",
        "kv_precision": "fp8",
        "engine": 2.0,
    }
    n = max((len(v) for v in cols.values() if isinstance(v, list)), default=1)
    return serving_inputs(spec, (g, g.cluster), pd.DataFrame({**base, **cols}, index=range(n)))


@pytest.mark.parametrize(
    "model",
    [
        "qwen3-30b-a3b",
        "qwen3-235b-a22b",
        "deepseek-v3",
        "kimi-k2",
        "mixtral-8x7b",
        "mixtral-8x22b",
        "llama4-scout",
        "llama4-maverick",
    ],
)
def test_the_moe_table_holds_the_shipped_moe_shapes(model: str) -> None:
    """Each shipped SwiGLU MoE model's exact shape was measured on some chip, in fp8_block
    (the block-scaled checkpoints' format) on the H200 and B200."""
    spec = catalog.get_model(model)
    shape = (spec.hidden, spec.moe_ffn_hidden, spec.num_experts, spec.topk)
    for chip in ("h200", "b200"):
        near = nearest_moe_shape(kernel_tables(chip), "fp8_block", True, *map(float, shape))
        assert near is not None
        assert (near.hidden, near.inter, near.experts, near.topk) == shape
        assert {(1, 1), (1, 8), (2, 1)} <= set(near.splits)
    assert sum(bool(kernel_tables(c).moe) for c in kernel_chips()) >= 7


def test_a_shape_between_measured_ones_scales_from_the_nearest() -> None:
    """An unmeasured shape takes its nearest measured one at the same routed copies per
    expert, times E x hidden x inter; one too far from every measured shape has none."""
    t = kernel_tables("h200")
    wider = (2048.0, 1024.0, 128.0, 8.0)
    near = moe_seconds(t, "fp8", True, wider, (1, 1), np.array([256.0]))
    measured = moe_seconds(t, "fp8", True, QWEN, (1, 1), np.array([256.0]))
    assert near == pytest.approx(measured * 1024.0 / 768.0)
    assert moe_seconds(t, "fp8", True, (64.0, 64.0, 8.0, 2.0), (1, 1), np.array([1.0])) is None


def test_a_routed_layer_takes_the_tables_time() -> None:
    """The step's routed experts are the table's fp8 layer at the iteration's tokens, times
    the layers, with the routed GEMMs' roofline gone; the static model's decode likewise."""
    s = inputs(tp=[1.0, 8.0])
    step = step_model(s)
    assert step.moe_rows.all()
    t = kernel_tables("h200")
    for j, tokens in enumerate(serving_gemm.TOKEN_GRID[:15]):
        for col, split in enumerate([(1, 1), (8, 1)]):
            direct = moe_seconds(t, "fp8", True, QWEN, split, np.array([tokens]))
            assert step.moe_curve[j, col] == pytest.approx(48.0 * direct[0], rel=1e-6)
    # Doubling the routed experts' roofline coefficients leaves a measured step unchanged.
    heavier = step_model(s)
    object.__setattr__(heavier, "gemm_flop_s", heavier.gemm_flop_s * 2.0)
    object.__setattr__(heavier, "gemm_weight_s", heavier.gemm_weight_s * 2.0)
    assert heavier.stage(256.0, 0.0, 0.0, 0.0, 1.0) == pytest.approx(
        step.stage(256.0, 0.0, 0.0, 0.0, 1.0)
    )
    one = inputs()
    layer = serving_moe.layer_seconds(one.x, np.array([256.0]), 1.0, 1.0, 1.0)
    direct = moe_seconds(t, "fp8", True, QWEN, (1, 1), np.array([256.0]))
    assert layer == pytest.approx(direct)
    assert np.isfinite(serve_time(one).decode_stage.total).all()


def test_weight_only_and_tableless_rows_keep_the_roofline() -> None:
    s = inputs(precision=["int4", "fp8"], kv_precision="bf16")
    assert list(step_model(s).moe_rows) == [False, True]
    cpu = inputs(gpu="cpu-gloo")
    assert not step_model(cpu).moe_rows.any()


def test_imbalance_costs_at_few_tokens_and_vanishes_at_many() -> None:
    """With experts over 8 ranks the busiest rank gets mean + sqrt(2 mean ln 8) copies: the
    layer is looked up at 1.7x the tokens at 8 tokens, 1.02x at 16,384; without expert
    parallelism nothing is added. Where the measured time is flat in tokens (weights
    streamed once), the extra copies cost little."""
    tokens = np.array([8.0, 256.0, 16384.0])
    busiest = serving_moe.busiest_rank_tokens(tokens, 8.0, 128.0, 8.0)
    mean = tokens * 8.0 / 8.0
    assert busiest == pytest.approx(tokens * (1.0 + np.sqrt(2.0 * np.log(8.0) / mean)))
    assert serving_moe.busiest_rank_tokens(tokens, 8.0, 128.0, 1.0) == pytest.approx(tokens)
    s = inputs(tp=8.0, ep=8.0)
    t = kernel_tables("h200")
    layer = serving_moe.layer_seconds(s.x, tokens, 8.0, 1.0, 1.0)
    assert layer is not None
    balanced = moe_seconds(t, "fp8", True, QWEN, (1, 8), tokens)
    ratio = layer / balanced
    assert ratio[0] > 1.1
    assert (ratio >= 1.0).all()
    assert ratio[2] < 1.02
    # 16 experts over 8 ranks: a token's 8 copies put at most 2 on a rank, twice the mean.
    one = serving_moe.busiest_rank_tokens(np.array([1.0]), 8.0, 16.0, 8.0)
    assert one == pytest.approx(2.0)


def test_the_expert_all_to_all_comes_from_the_measured_table() -> None:
    """Dispatch and combine are two NCCL all-to-alls over the 8 ranks of the tokens' k copies,
    as measured on the H200 node; the MLP's all-reduce and the bytes-over-bandwidth term are
    gone from the expert-parallel row."""
    s = inputs(tp=[8.0, 8.0], ep=[1.0, 8.0])
    step = step_model(s)
    assert step.comm_token_s[1] == 0.0
    t = kernel_tables("h200")
    for j, tokens in enumerate(serving_gemm.TOKEN_GRID):
        buffer = tokens * 8.0 * 1.0 * 2048.0  # k copies of fp8 activations of 2048
        a2a = 2.0 * collective_seconds(t, "alltoall", np.array(8.0), np.array(buffer))
        all_reduce = measured_all_reduce(s, np.full(2, 2.0 * tokens * 2048.0))
        assert all_reduce is not None
        assert step.comm_curve[j, 0] == pytest.approx(48.0 * 2.0 * all_reduce[0], rel=1e-6)
        assert step.comm_curve[j, 1] == pytest.approx(48.0 * (all_reduce[1] + a2a), rel=1e-6)
    direct = serving_moe.all_to_all_seconds(s.x, np.full(2, 256.0), s.ep, s.act_bytes)
    assert direct is not None and direct[0] == 0.0 and direct[1] > 0.0
