"""Activation offload (cost/activation_offload.py): the saved activations that leave the GPU
for host memory, the seconds the copies add beyond the layers' compute, the frameworks and
layouts that refuse it, the search taking it only where nothing else fits, and the flags."""

from __future__ import annotations

import pandas as pd
import pytest
from helpers import assert_user_error
from helpers import run_cli as run

from autoconfig import api
from autoconfig.cost import host
from autoconfig.layout_search import run as search_run
from autoconfig.report import exports
from autoconfig.spec import layout
from autoconfig.spec.vocab import GIB

MEGATRON = {"tp": 2, "gbs": 8, "seq_len": 16384, "task": "sft", "framework": "megatron"}
TORCHTUNE = {"zero": 3, "recompute": "full", "gbs": 8, "seq_len": 16384, "task": "sft"}


def _estimate(on: bool, **args: object) -> pd.Series:
    return api.estimate("llama3-8b", 8, "h100-sxm-80gb", activation_offload=on, **args).iloc[0]


def test_the_gpu_keeps_the_resident_layers_and_the_host_the_rest() -> None:
    kept, moved = _estimate(False, **MEGATRON), _estimate(True, **MEGATRON)
    per_layer = kept["mem_activations_gib"] / 32  # llama3-8b: 32 layers, one stage
    # Megatron-Core's profile keeps 2 layers' saved activations (the one computing, one copying)
    assert moved["mem_activations_gib"] == pytest.approx(2 * per_layer)
    assert moved["mem_host_gib"] == pytest.approx(30 * per_layer)
    share = kept["mem_overhead_gib"] - moved["mem_overhead_gib"]
    drop = kept["pred_peak_mem_gib"] - moved["pred_peak_mem_gib"]
    assert drop == pytest.approx(30 * per_layer + share)
    assert moved["act_bytes_per_layer"] == kept["act_bytes_per_layer"]  # before offload


def test_copies_cost_what_outlasts_each_layers_compute() -> None:
    kept, moved = _estimate(False, **MEGATRON), _estimate(True, **MEGATRON)
    copy = kept["act_bytes_per_layer"] / (host.host_link_gb_s("h100-sxm-80gb", "h100") * 1e9)
    f, b = kept["layer_forward_s"], kept["layer_backward_s"]
    micro_batches = 8 / 4  # gbs over dp 4, one sequence each
    exposed = micro_batches * 30 * (max(copy - f, 0.0) + max(copy - b, 0.0))
    assert exposed > 0.1  # 16k tokens a GPU save far more than PCIe moves in a layer's time
    assert moved["time_offload_s"] == pytest.approx(exposed)
    assert moved["pred_step_time_s"] == pytest.approx(kept["pred_step_time_s"] + exposed)


def test_checkpointed_inputs_hide_behind_compute() -> None:
    # torchtune offloads only each layer's input under full recompute: a small copy
    kept, moved = (_estimate(on, framework="torchtune", **TORCHTUNE) for on in (False, True))
    assert moved["mem_host_gib"] > 0
    assert moved["mem_activations_gib"] < kept["mem_activations_gib"]
    assert moved["time_offload_s"] == 0.0
    assert moved["pred_step_time_s"] == kept["pred_step_time_s"]


@pytest.mark.parametrize(
    ("extra", "needles"),
    [
        (("--recompute", "full"), ("activation_offload", "megatron", "recompute none")),
        (("--pp", "2"), ("activation_offload", "pipeline")),
        (("--framework", "torchtitan", "--zero", "3"), ("activation_offload", "never")),
    ],
)
def test_where_it_cannot_run_is_one_line(extra: tuple[str, ...], needles: tuple[str, ...]) -> None:
    result = run(
        "estimate", "--model", "llama3-8b", "--gpus", "8", "--gbs", "8", "--seq-len", "8192",
        "--activation-offload", *extra,
    )  # fmt: skip
    assert_user_error(result, *needles)


def test_torchtune_offloads_only_with_checkpointing() -> None:
    result = run(
        "estimate", "--model", "llama3-8b", "--gpus", "8", "--gbs", "8", "--seq-len", "8192",
        "--framework", "torchtune", "--zero", "3", "--recompute", "none", "--task", "sft",
        "--activation-offload",
    )  # fmt: skip
    assert_user_error(result, "activation_offload", "torchtune", "recompute full")


def test_the_search_offloads_activations_only_where_nothing_else_fits() -> None:
    def top(limit: float | None) -> pd.Series:
        req = search_run.make_request(
            "llama3-8b", 8, "h100-sxm-80gb", seq_len=16384, gbs=8, task="sft",
            framework="megatron", max_memory_gib=limit,
            fix={"tp": 2, "pp": 1, "cp": 1, "zero": 1, "recompute": "none", "mbs": 1},
        )  # fmt: skip
        table = search_run.evaluate_all(req).table
        return table[table["pruned"] == ""].iloc[0]

    roomy = top(None)
    assert not roomy["activation_offload"]
    tight = top(50.0)  # 76.7 GiB without; the optimizer's offload still leaves 52.6
    assert tight["activation_offload"]
    assert tight["offload"] == "none"
    assert tight["pred_peak_mem_gib"] <= 50.0
    assert tight["mem_host_gib"] * GIB > 0


def test_exports_emit_the_activation_offload_settings() -> None:
    row = layout.plain(
        layout.Layout(dp=4, tp=2, zero=1, sp=True, activation_offload=True).model_dump()
    )
    megatron = exports.export("megatron", row, 32, 8, 16384, "bf16")
    assert "--cpu-offloading" in megatron and "--cpu-offloading-num-layers 31" in megatron
    nemo = exports.export("nemo", row, 32, 8, 16384, "bf16")
    assert "recipe.model.config.cpu_offloading = True" in nemo
    assert "recipe.model.config.cpu_offloading_num_layers = 31" in nemo
    tune_row = {**row, "tp": 1, "dp": 8, "sp": False, "zero": 3, "recompute": "full"}
    tune_row["recompute_layers"] = 32
    torchtune = exports.export("torchtune", tune_row, 32, 8, 16384, "bf16")
    assert "enable_activation_offloading=True" in torchtune
    plain = exports.export("megatron", {**row, "activation_offload": False}, 32, 8, 16384, "bf16")
    assert "cpu-offloading" not in plain


def test_a_fixed_activation_offload_is_every_layouts() -> None:
    req = search_run.make_request(
        "llama3-8b", 8, "h100-sxm-80gb", seq_len=16384, gbs=8, task="sft",
        framework="megatron", fix={"activation_offload": True, "tp": 2, "recompute": "none"},
    )  # fmt: skip
    result = search_run.evaluate_all(req)
    assert result.feasible
    table = result.table
    assert table["activation_offload"].all() and (table["pp"] == 1).all()
    best = table[table["pruned"] == ""].iloc[0]
    assert best["mem_host_gib"] > 0


def test_the_search_takes_the_fastest_offload_that_fits() -> None:
    # torchtune under full recompute: the layer inputs' copies hide behind compute, while
    # offloading the optimizer with the weights pays the CPU's Adam step; both fit at 41 GiB
    fix = {"zero": 3, "recompute": "full", "mbs": 1, "optimizer_state": "fp32"}

    def best(**pinned: object) -> pd.Series:
        req = search_run.make_request(
            "llama3-8b", 8, "h100-sxm-80gb", seq_len=16384, gbs=8, task="sft",
            framework="torchtune", max_memory_gib=41.0, fix={**fix, **pinned},
        )  # fmt: skip
        table = search_run.evaluate_all(req).table
        return table[table["pruned"] == ""].iloc[0]

    chosen = best()
    host_only = best(activation_offload=False)  # what the optimizer's offload alone gives
    assert host_only["offload"] == "optimizer+params"
    assert chosen["activation_offload"] and chosen["offload"] == "none"
    assert chosen["pred_tokens_per_s_per_gpu"] > host_only["pred_tokens_per_s_per_gpu"]
