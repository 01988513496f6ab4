"""CPU offload (vocab.Offload, cost/offload.py): the bytes that leave the GPU for the host, the
seconds the host link and the CPU's Adam step add, the frameworks that refuse it, the launch
flags, the search taking it only where nothing else fits, and the host-link figures RL shares."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from helpers import assert_user_error
from helpers import run_cli as run

from autoconfig import api
from autoconfig.columns import frameworks
from autoconfig.columns.build import Hardware, training_inputs
from autoconfig.cost import evaluate, host, offload
from autoconfig.spec import catalog, layout
from autoconfig.spec.vocab import GIB

LAYOUT = {"tp": 2, "zero": 1, "gbs": 64, "seq_len": 4096}


def _estimate(mode: str, framework: str = "megatron", **extra: object) -> dict:
    args = {**LAYOUT, **extra}
    return api.estimate(
        "llama2-7b", 8, "h100-sxm-80gb", offload=mode, framework=framework, **args
    ).iloc[0]


def test_optimizer_offload_moves_the_optimizer_bytes_to_the_host() -> None:
    on_gpu, off = _estimate("none"), _estimate("optimizer")
    moved = on_gpu["mem_optimizer_gib"]
    assert moved > 1.0
    assert off["mem_optimizer_gib"] == 0.0
    # the GPU's peak drops by the optimizer bytes (and the overhead charged on them)
    share = on_gpu["mem_overhead_gib"] - off["mem_overhead_gib"]
    assert on_gpu["pred_peak_mem_gib"] - off["pred_peak_mem_gib"] == pytest.approx(moved + share)
    for part in ("mem_weights_gib", "mem_gradients_gib", "mem_activations_gib"):
        assert off[part] == on_gpu[part]
    # the host holds them with an fp32 gradient copy: 12 + 4 bytes for every 12 moved
    assert off["mem_host_gib"] == pytest.approx(moved * 16.0 / 12.0)
    assert on_gpu["mem_host_gib"] == 0.0
    # DGX H100: 2 TB of host memory for 8 GPUs
    assert off["host_capacity_gib"] == pytest.approx(256.0)


def test_parameter_offload_moves_weights_gradients_and_optimizer() -> None:
    args = {"zero": 3, "framework": "torchtitan"}
    on_gpu = _estimate("none", **args)
    off = _estimate("optimizer+params", **args)
    for part in ("mem_weights_gib", "mem_gradients_gib", "mem_optimizer_gib"):
        assert on_gpu[part] > 0.0
        assert off[part] == 0.0
    moved = sum(on_gpu[p] for p in ("mem_weights_gib", "mem_gradients_gib", "mem_optimizer_gib"))
    assert off["mem_host_gib"] == pytest.approx(moved)
    assert off["mem_transient_gib"] == on_gpu["mem_transient_gib"]  # gathered layers stay


def _inputs(mode: str, overlap: float):
    """A ZeRO-1 Llama 2 7B layout on 8 H100s (dp 4, tp 2) whose copies overlap as `overlap`
    says (schema.OFFLOAD_OVERLAPS index)."""
    gpu = catalog.get_gpu("h100-sxm-80gb")
    row = {**layout.Layout().model_dump(), "dp": 4, "tp": 2, "zero": 1, "offload": mode}
    does = frameworks.behaviour(catalog.get_framework("megatron"), "bf16")
    does = replace(does, offload_overlap=overlap, offload_upload_bytes=4.0)
    model = catalog.get_model("llama2-7b")
    table = layout.frame_of([layout.plain(row)])
    return training_inputs(model, Hardware(gpu, gpu.cluster), table, 64, 4096, does)


def test_unhidden_offload_adds_the_copies_and_the_cpu_step() -> None:
    on_gpu = evaluate(_inputs("none", 0.0))
    off = evaluate(_inputs("optimizer", 0.0))
    # the parameters of the rank's optimizer shard, from its fp32 optimizer bytes (12 each)
    params = float(on_gpu["mem_optimizer_gib"][0]) * GIB / 12.0
    link = host.host_link_gb_s("h100-sxm-80gb", "h100") * 1e9
    dram = host.host_dram_gb_s("h100-sxm-80gb", "h100") * 1e9
    # fp32 gradients down, fp32 parameters up, 28 bytes of CPU Adam traffic a parameter
    expected = (4.0 + 4.0) * params / link + 28.0 * params / dram
    assert float(off["time_offload_s"][0]) == pytest.approx(expected, rel=1e-6)
    assert float(on_gpu["time_offload_s"][0]) == 0.0
    # the GPU's own Adam step is gone; the step grows by what replaces it
    gpu_adam = float(on_gpu["time_optimizer_s"][0] - off["time_optimizer_s"][0])
    assert gpu_adam > 0.0
    grown = float(off["pred_step_time_s"][0] - on_gpu["pred_step_time_s"][0])
    assert grown == pytest.approx(expected - gpu_adam, rel=1e-6)


def test_pipelined_copies_hide_behind_the_cpu_step() -> None:
    serial = float(evaluate(_inputs("optimizer", 0.0))["time_offload_s"][0])
    pipelined = float(evaluate(_inputs("optimizer", offload.WITH_STEP))["time_offload_s"][0])
    x = _inputs("optimizer", offload.WITH_STEP)
    params = float(evaluate(_inputs("none", 0.0))["mem_optimizer_gib"][0]) * GIB / 12.0
    cpu = 28.0 * params / float(x.host_dram_bytes_s)
    assert pipelined == pytest.approx(cpu, rel=1e-6)  # the CPU step is the longest of three
    assert serial > pipelined


def test_the_host_link_sets_the_copy_time() -> None:
    """The same layout on a Grace host (NVLink-C2C) copies faster than over PCIe."""
    x = _inputs("optimizer", 0.0)
    pcie = float(evaluate(x)["time_offload_s"][0])
    c2c = replace(x, host_link_bytes_s=np.float64(host.GRACE_HOST_LINK_GB_S * 1e9))
    assert float(evaluate(c2c)["time_offload_s"][0]) < pcie


@pytest.mark.parametrize(
    ("framework", "mode", "needles"),
    [
        ("nanotron", "optimizer", ("nanotron", "offload")),
        ("composer", "optimizer", ("composer", "offload")),
        ("megatron", "optimizer+params", ("megatron", "offload")),
        ("torchtitan", "optimizer", ("torchtitan", "offload")),
    ],
)
def test_a_framework_that_cannot_offload_refuses_in_one_line(
    framework: str, mode: str, needles: tuple[str, ...]
) -> None:
    zero = "3" if framework in ("composer", "torchtitan") else "1"
    result = run(
        "estimate", "--model", "llama2-7b", "--gpus", "8", "--tp", "2", "--zero", zero,
        "--gbs", "64", "--framework", framework, "--offload", mode,
    )  # fmt: skip
    assert_user_error(result, *needles)


def test_megatron_offloads_only_with_the_distributed_optimizer() -> None:
    result = run(
        "estimate", "--model", "llama2-7b", "--gpus", "8", "--tp", "2", "--zero", "0",
        "--gbs", "64", "--offload", "optimizer",
    )  # fmt: skip
    assert_user_error(result, "offload", "ZeRO 1")


def test_offload_keeps_fp32_adam_state() -> None:
    result = run(
        "estimate", "--model", "llama2-7b", "--gpus", "8", "--tp", "2", "--zero", "1",
        "--gbs", "64", "--offload", "optimizer", "--optimizer-state", "bf16",
    )  # fmt: skip
    assert_user_error(result, "offload", "fp32")


def test_a_bad_value_names_the_field_and_the_allowed_values() -> None:
    result = run("estimate", "--model", "llama2-7b", "--gpus", "8", "--offload", "disk")
    assert_user_error(result, "offload", "none", "optimizer", "optimizer+params")


def test_search_refuses_a_fixed_offload_the_framework_lacks() -> None:
    result = run(
        "search", "--model", "llama2-7b", "--gpus", "8", "--framework", "torchtitan",
        "--fix", "offload=optimizer",
    )  # fmt: skip
    assert_user_error(result, "offload", "torchtitan", "optimizer")


def test_exports_emit_the_offload_settings() -> None:
    from autoconfig.report import exports

    base = layout.plain(layout.Layout(dp=4, tp=2, zero=1, sp=True).model_dump())
    row = {**base, "offload": "optimizer"}
    megatron = exports.export("megatron", row, 8, 64, 4096, "bf16")
    for flag in (
        "--optimizer-cpu-offload",
        "--optimizer-offload-fraction 1.0",
        "--overlap-cpu-optimizer-d2h-h2d",
        "--use-precision-aware-optimizer",
    ):
        assert flag in megatron
    nemo = exports.export("nemo", row, 8, 64, 4096, "bf16")
    assert "recipe.optim.config.optimizer_cpu_offload = True" in nemo
    plain = exports.export("megatron", {**row, "offload": "none"}, 8, 64, 4096, "bf16")
    assert "offload" not in plain
    sharded = {**base, "dp": 8, "tp": 1, "sp": False, "zero": 3, "offload": "optimizer+params"}
    deepspeed = exports.export("deepspeed", sharded, 8, 64, 4096, "bf16")
    assert 'offload_optimizer = {"device": "cpu", "pin_memory": true}' in deepspeed
    assert 'offload_param = {"device": "cpu", "pin_memory": true}' in deepspeed
    titan = exports.export("torchtitan", sharded, 8, 64, 4096, "bf16")
    assert "enable_cpu_offload = true" in titan


FINETUNE = {"gpu": "a100-sxm-80gb", "task": "sft", "framework": "torchtitan", "seq_len": 2048}


def test_search_offloads_a_70b_full_finetune_on_eight_a100s() -> None:
    """Llama 3 70B trains 16+ bytes of state a parameter: ~140 GiB a GPU on 8, over the A100's
    80 GB whatever the layout; with FSDP CPU offload it fits."""
    result = api.search("llama3-70b", 8, gbs=16, **FINETUNE)
    assert result.feasible
    best = result.table.iloc[0]
    assert best["offload"] == "optimizer+params"
    assert best["pred_peak_mem_gib"] <= best["mem_limit_gib"]
    assert 0 < best["mem_host_gib"] <= best["host_capacity_gib"]
    assert best["time_offload_s"] > 0
    on_gpu = api.search("llama3-70b", 8, gbs=16, fix={"offload": "none"}, **FINETUNE)
    assert not on_gpu.feasible


def test_search_does_not_offload_what_fits_on_the_gpu() -> None:
    result = api.search("llama3-8b", 8, gbs=16, **FINETUNE)
    feasible = result.table[result.table["pruned"] == ""]
    assert feasible.iloc[0]["offload"] == "none"
    # no layout that fits on the GPU took offload
    assert (feasible["offload"] != "none").sum() == 0


def test_host_memory_bounds_what_offload_may_hold() -> None:
    """Llama 3 405B's 18 bytes of state a parameter over 8 GPUs is ~850 GiB a GPU: more than
    a DGX A100's 2 TB gives each of its 8 GPUs."""
    result = api.search("llama3-405b", 8, gbs=16, **FINETUNE)
    assert not result.feasible  # the search gives no layout an offload the host cannot hold
    fixed = api.search("llama3-405b", 8, gbs=16, fix={"offload": "optimizer+params"}, **FINETUNE)
    assert not fixed.feasible
    assert "host memory" in fixed.pruned
    row = fixed.table[fixed.table["pruned"].str.startswith("host memory")].iloc[0]
    assert row["pred_peak_mem_gib"] <= row["mem_limit_gib"]  # the GPU side would fit
    assert row["mem_host_gib"] > row["host_capacity_gib"] == pytest.approx(256.0)


def test_rl_reads_the_shared_host_link_figures() -> None:
    from autoconfig.rl import sync

    assert sync.host is host  # one table, not a copy
    assert host.host_link_gb_s("a100-sxm-80gb", "a100") == 25.0
    assert host.host_link_gb_s("h100-sxm-80gb", "h100") == 50.0
    assert host.host_link_gb_s("gb200", "b200") == 360.0
    assert host.host_link_gb_s("unknown-gpu", "unknown") == 25.0


def test_the_bundled_trainer_refuses_offload() -> None:
    done = run("train", "--model", "tiny-llama", "--device", "cpu", "--offload", "optimizer")
    assert_user_error(done, "offload:", "on the device")


def test_gradients_reduced_every_micro_batch_go_down_every_micro_batch() -> None:
    """FSDP2 and ZeRO-2 copy each micro-batch's reduced gradients to the host: m copies, each
    exposed beyond its own backward; a step reducing once copies once."""
    from types import SimpleNamespace

    x = SimpleNamespace(
        host_link_bytes_s=np.array([25e9]), host_dram_bytes_s=np.array([40e9]),
        offload=np.array([1.0]), offload_upload_bytes=np.array([4.0]),
        offload_overlap=np.array([0.0]),  # serial: every copy on the critical path
    )  # fmt: skip
    once = offload.step_seconds(x, 1e9, 0.0, 4.0, 0.0, 0.0, downs=1.0)
    every = offload.step_seconds(x, 1e9, 0.0, 4.0, 0.0, 0.0, downs=4.0)
    down = offload.GRAD_DOWN_BYTES * 1e9 / 25e9
    assert every - once == pytest.approx(3 * down)
    x.offload_overlap = np.array([2.0])  # with the backward: what exceeds each backward shows
    hidden = offload.step_seconds(x, 1e9, 0.0, 4.0, 0.0, 0.1, downs=4.0)
    assert hidden - offload.step_seconds(x, 1e9, 0.0, 4.0, 0.0, 0.1, downs=1.0) == (
        pytest.approx(3 * (down - 0.1))
    )
