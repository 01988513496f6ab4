"""Lighter Adam state (vocab.OptimizerState, cost/optimizer.py): the bytes each choice keeps,
the optimizer step's traffic, the frameworks that refuse it, and the seed figure it answers."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from helpers import assert_user_error
from helpers import run_cli as run

from autoconfig import api
from autoconfig.columns import frameworks
from autoconfig.columns.build import Hardware, training_inputs
from autoconfig.cost import optimizer
from autoconfig.spec import catalog, layout
from autoconfig.spec.vocab import OptimizerState

STATES = [s.value for s in OptimizerState]
LAYOUT = {"tp": 2, "pp": 1, "zero": 1, "sp": True}


def _inputs(framework: str, precision: str = "bf16"):
    """One row per optimizer state of a ZeRO-1 Llama 2 7B layout run by `framework`."""
    gpu = catalog.get_gpu("h100-sxm-80gb")
    rows = [{**LAYOUT, "dp": 4, "optimizer_state": s} for s in STATES]
    table = layout.frame_of([layout.plain({**layout.Layout().model_dump(), **r}) for r in rows])
    does = frameworks.behaviour(catalog.get_framework(framework), precision)
    model = catalog.get_model("llama2-7b")
    return training_inputs(model, Hardware(gpu, gpu.cluster, precision), table, 64, 4096, does)


@pytest.mark.parametrize(
    ("framework", "precision", "expected"),
    [
        # fp32: main params 4 + moments 4 + 4. bf16: moments 2 + 2, fp32 main params as the
        # 16-bit remainder of their bf16 copy (2). fp8: first moment 1, second 2, remainder 2.
        ("megatron", "bf16", [12.0, 6.0, 5.0]),
        # fp8 parameters have no bf16 copy to complete: the fp32 main parameters stay whole
        ("megatron", "fp8", [12.0, 6.0, 5.0]),
        # torchtitan's bf16 moments sit beside whole fp32 parameters: 4 + 2 + 2
        ("torchtitan", "bf16", [12.0, 8.0, 7.0]),
    ],
)
def test_bytes_per_parameter_follow_the_dtypes(
    framework: str, precision: str, expected: list[float]
) -> None:
    x = _inputs(framework, precision)
    got = np.broadcast_to(optimizer.state_bytes(x), (3,))
    assert got.tolist() == expected


def test_fp8_parameters_keep_whole_main_parameters() -> None:
    x = _inputs("megatron", "fp8")
    fp8_params = replace(x, param_bytes=np.float64(1.0))
    assert np.broadcast_to(optimizer.state_bytes(fp8_params), (3,)).tolist() == [12.0, 8.0, 7.0]


def _estimate(state: str, framework: str = "megatron"):
    return api.estimate(
        "llama2-7b", 8, "h100-sxm-80gb", tp=2, zero=1, gbs=64, seq_len=4096,
        optimizer_state=state, framework=framework,
    ).iloc[0]  # fmt: skip


def test_optimizer_memory_is_the_state_bytes_times_the_parameters() -> None:
    rows = {s: _estimate(s) for s in STATES}
    fp32 = rows["fp32"]["mem_optimizer_gib"]
    for state, kept in zip(STATES, (12.0, 6.0, 5.0), strict=True):
        assert rows[state]["mem_optimizer_gib"] == pytest.approx(fp32 * kept / 12.0, rel=1e-12)
    # nothing else in the state moves
    for part in ("mem_weights_gib", "mem_gradients_gib", "mem_activations_gib"):
        assert {rows[s][part] for s in STATES} == {fp32_part := rows["fp32"][part]}, fp32_part


def test_lighter_state_moves_fewer_bytes_in_the_optimizer_step() -> None:
    times = [_estimate(s)["time_optimizer_s"] for s in STATES]
    assert times[0] > times[1] > times[2] > 0
    # traffic per parameter: 4 (fp32 gradient) + 2 x state + 2 (bf16 weights written), beside
    # the step's fixed overhead: what each state saves is twice the bytes it drops
    saved_bf16, saved_fp8 = times[0] - times[1], times[0] - times[2]
    assert saved_bf16 / saved_fp8 == pytest.approx(2 * (12 - 6) / (2 * (12 - 5)))
    steps = [_estimate(s)["pred_step_time_s"] for s in STATES]
    assert steps[0] > steps[1] > steps[2]


def test_default_state_leaves_the_prediction_unchanged() -> None:
    row = _estimate("fp32")
    assert row["optimizer_state"] == "fp32"
    default = api.estimate("llama2-7b", 8, "h100-sxm-80gb", tp=2, zero=1, gbs=64, seq_len=4096)
    assert default.iloc[0]["pred_step_time_s"] == row["pred_step_time_s"]


@pytest.mark.parametrize("framework", ["deepspeed", "nanotron", "composer"])
def test_a_framework_without_it_refuses_it(framework: str) -> None:
    result = run(
        "estimate", "--model", "llama2-7b", "--gpus", "8", "--tp", "2", "--zero", "1",
        "--gbs", "64", "--framework", framework, "--optimizer-state", "bf16",
        *(["--zero", "2"] if framework == "composer" else []),
    )  # fmt: skip
    assert_user_error(result, framework, "optimizer_state")


def test_torchtitan_refuses_fp8_state_in_the_search() -> None:
    result = run(
        "search", "--model", "llama2-7b", "--gpus", "8", "--framework", "torchtitan",
        "--fix", "optimizer_state=fp8",
    )  # fmt: skip
    assert_user_error(result, "torchtitan", "optimizer_state", "fp8")


def test_megatron_runs_lighter_state_only_with_the_distributed_optimizer() -> None:
    result = run(
        "estimate", "--model", "llama2-7b", "--gpus", "8", "--tp", "2", "--zero", "0",
        "--gbs", "64", "--optimizer-state", "bf16",
    )  # fmt: skip
    assert_user_error(result, "megatron", "optimizer_state", "ZeRO")


def test_exports_emit_the_precision_aware_optimizer() -> None:
    from autoconfig.report import exports

    row = {**layout.plain(layout.Layout(**LAYOUT, dp=4).model_dump()), "optimizer_state": "fp8"}
    megatron = exports.export("megatron", row, 8, 64, 4096, "bf16")
    for flag in (
        "--use-precision-aware-optimizer",
        "--exp-avg-dtype fp8",
        "--exp-avg-sq-dtype bf16",
    ):
        assert flag in megatron
    nemo = exports.export("nemo", row, 8, 64, 4096, "bf16")
    assert "recipe.optim.config.exp_avg_dtype = torch.uint8" in nemo
    plain = exports.export("megatron", {**row, "optimizer_state": "fp32"}, 8, 64, 4096, "bf16")
    assert "precision-aware" not in plain


def test_seed_llama2_70b_sft_on_eight_h200_fits_with_lighter_state() -> None:
    """NVIDIA's NeMo H200 announcement: Llama 2 70B SFT on one HGX H200, fp8, seq 4096, gbs
    128, 1,880 tokens/s/GPU with "mixed-precision implementations of the model optimizer's
    state"; with fp32 state nothing fits."""
    args = {"gpu": "h200-sxm-141gb", "precision": "fp8", "seq_len": 4096, "gbs": 128}
    result = api.search("llama2-70b", 8, task="sft", framework="nemo", **args)
    assert result.feasible
    best = result.table.iloc[0]
    assert best["optimizer_state"] != "fp32"
    assert best["pred_peak_mem_gib"] <= best["mem_limit_gib"]
    # kept on the GPU (no CPU offload: tests/test_offload.py)
    on_gpu = {"optimizer_state": "fp32", "offload": "none"}
    fp32 = api.search("llama2-70b", 8, task="sft", framework="nemo", fix=on_gpu, **args)
    assert not fp32.feasible


def test_a_layout_that_fits_with_fp32_state_keeps_it() -> None:
    result = api.search("llama2-7b", 8, gpu="h200-sxm-141gb", seq_len=4096, gbs=128)
    feasible = result.table[result.table["pruned"] == ""]
    assert feasible.iloc[0]["optimizer_state"] == "fp32"
