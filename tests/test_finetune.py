"""The training task (pretrain, sft, lora, qlora): each rule of its physics, the refusals, the
`task` column of --runs and the exported settings."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from autoconfig import api
from autoconfig.cost import evaluate, finetune
from autoconfig.cost.flops import model_flops_per_token
from autoconfig.cost.layer import layer_ops, total
from autoconfig.cost.memory import memory, stage_params
from autoconfig.cost.timing import _data_parallel, _op_times, step_time
from autoconfig.report import exports
from autoconfig.spec.task import TaskSpec, task_spec
from autoconfig.spec.vocab import GIB, LoraTargets, Task
from tests.helpers import make_inputs, run_cli

MODEL, GPU = "llama2-7b", "h100-sxm-80gb"
LAYOUT = {"tp": 1.0, "pp": 1.0, "dp": 8.0, "mbs": 1.0, "gbs": 32.0, "seq": 4096.0, "zero": 0.0}


def inputs(task: Task = Task.PRETRAIN, rank: int = 16, targets: str = "all", **layout: float):
    spec = TaskSpec(task, rank, LoraTargets(targets))
    return make_inputs(MODEL, GPU, **{**LAYOUT, **layout, **spec.columns()})


def test_sft_is_pretraining_physics() -> None:
    pre, sft = evaluate(inputs()), evaluate(inputs(Task.SFT))
    for name in ("pred_tokens_per_s_per_gpu", "pred_peak_mem_gib", "pred_mfu"):
        assert np.allclose(pre[name], sft[name])


def test_frozen_weights_have_no_gradients_and_no_optimizer_state() -> None:
    x = inputs(Task.LORA)
    p = stage_params(x)
    m = memory(x)
    adapters = float(p.adapter_first)
    assert adapters > 0
    # ZeRO 0: the adapters' fp32 gradients (4 B) and fp32 master + Adam moments (12 B) only
    assert float(m.gradients) == pytest.approx(4.0 * adapters, rel=1e-5)
    assert float(m.optimizer) == pytest.approx(12.0 * adapters, rel=1e-5)
    # the frozen base keeps its 16-bit working copy, the adapters theirs
    base = float(p.dense_first)
    assert float(m.weights) == pytest.approx(2.0 * (base + adapters), rel=1e-5)


def test_adapter_parameters_are_two_rank_r_matrices_per_targeted_linear() -> None:
    h, kv, ffn, layers, r = 4096, 4096, 11008, 32, 16
    per_layer = {
        "qkv": r * (h + h) + r * (h + 2 * kv),  # q; k and v together
        "attention": r * (h + h) + r * (h + 2 * kv) + r * (h + h),
        "all": r * (h + h) + r * (h + 2 * kv) + r * (h + h) + r * (h + 2 * ffn) + r * (ffn + h),
    }
    for targets, expected in per_layer.items():
        p = stage_params(inputs(Task.LORA, rank=r, targets=targets))
        assert float(p.adapter_first) == pytest.approx(layers * expected, rel=1e-5)


def test_lora_backward_is_input_gradients_plus_adapters() -> None:
    full, lora = inputs(), inputs(Task.LORA, targets="qkv")
    tokens = 4096.0
    gemms = [op for op in layer_ops(full) if op.kind == "gemm" and np.any(op.present)]
    f_full = sum(float(_op_times(full, op, tokens)[0]) for op in gemms)
    b_full = sum(float(_op_times(full, op, tokens)[1]) for op in gemms)
    b_lora = sum(float(_op_times(lora, op, tokens)[1]) for op in gemms)
    # the weight-gradient GEMMs are gone: backward about one forward's worth, not two
    assert b_lora < 0.65 * b_full
    assert b_lora == pytest.approx(f_full, rel=0.25)
    # the adapters' FLOPs are small but counted: 2 r (k + n) per adapted GEMM per token
    adapters = [op for op in layer_ops(lora) if op.adapter]
    assert {op.name for op in adapters} == {"lora_q_proj", "lora_kv_proj"}
    assert float(total(adapters, "flops")) == pytest.approx(
        2 * 16 * (4096 + 4096) + 2 * 16 * (4096 + 8192), rel=1e-5
    )


def test_a_lora_step_is_faster_and_model_flops_do_not_count_adapters() -> None:
    full, lora = inputs(), inputs(Task.LORA, targets="qkv")
    assert float(step_time(lora).compute) < float(step_time(full).compute)
    assert np.allclose(model_flops_per_token(full), model_flops_per_token(lora))


def test_qlora_base_weights_take_4_127_bits() -> None:
    lora, qlora = inputs(Task.LORA), inputs(Task.QLORA)
    p = stage_params(qlora)
    linear = float(p.linear_first)
    lora_w, qlora_w = float(memory(lora).weights), float(memory(qlora).weights)
    assert lora_w - qlora_w == pytest.approx(linear * (2.0 - 4.127 / 8.0), rel=1e-4)
    assert pytest.approx(4.127, abs=5e-4) == finetune.NF4_BITS_PER_PARAM


def test_qlora_pays_a_dequantization_pass_forward_and_backward() -> None:
    x = inputs(Task.QLORA)
    op = next(op for op in layer_ops(x) if op.name == "nf4_dequant")
    params = float(stage_params(x).linear_first) / 32
    tokens = 4096.0
    moved = float(op.moved) * tokens
    assert moved == pytest.approx(params * (4.127 / 8 + 2.0), rel=1e-4)
    fwd, bwd = _op_times(x, op, tokens)
    assert float(bwd) == pytest.approx(float(fwd))
    assert float(step_time(x).compute) > float(step_time(inputs(Task.LORA)).compute)


def test_data_parallelism_reduces_only_trainable_gradients() -> None:
    for zero in (0.0, 1.0):
        full, lora = inputs(zero=zero), inputs(Task.LORA, zero=zero)
        args = (np.float64(4.0), np.float64(32.0), np.float64(1e-3), np.float64(2e-3))
        full_comm = float(_data_parallel(full, stage_params(full), *args[:2], *args[2:], 0.0)[0])
        lora_comm = float(_data_parallel(lora, stage_params(lora), *args[:2], *args[2:], 0.0)[0])
        ratio = float(stage_params(lora).adapter_first) / float(stage_params(full).dense_first)
        assert lora_comm < full_comm * 10 * ratio + 1e-4


def test_zero3_still_gathers_the_frozen_weights() -> None:
    lora = inputs(Task.LORA, zero=3.0)
    args = (np.float64(4.0), np.float64(32.0), np.float64(0.0), np.float64(0.0), 0.0)
    comm = float(_data_parallel(lora, stage_params(lora), *args)[0])
    full = inputs(zero=3.0)
    full_comm = float(_data_parallel(full, stage_params(full), *args)[0])
    assert comm > 0.5 * full_comm  # the gathers of every weight remain


def test_lora_keeps_the_activations_of_full_training() -> None:
    full, lora = memory(inputs()), memory(inputs(Task.LORA))
    assert float(lora.activations) >= float(full.activations)
    extra = float(lora.activations) - float(full.activations)
    assert extra < 0.02 * float(full.activations)  # only the adapters' rank-r outputs


def test_task_spec_refuses_bad_input() -> None:
    for bad, field in ((0, "lora-rank"), ("x", "lora-rank"), (2.5, "lora-rank")):
        with pytest.raises(ValueError, match=field):
            task_spec("lora", bad)
    with pytest.raises(ValueError, match="lora-targets"):
        task_spec("lora", 16, "mlp")
    with pytest.raises(ValueError, match="task"):
        task_spec("dpo")


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--task", "qlora", "--framework", "nemo"), "nemo cannot run qlora"),
        (("--task", "lora", "--framework", "megatron"), "megatron cannot run lora"),
        (("--task", "lora", "--lora-rank", "0"), "lora-rank"),
        (("--task", "lora", "--lora-rank", "abc"), "lora-rank"),
        (("--task", "lora", "--lora-targets", "mlp"), "lora-targets"),
        (("--task", "finetune"), "task"),
        (("--task", "qlora", "--framework", "deepspeed", "--precision", "fp8"), "precision"),
    ],
)
def test_cli_refuses_with_one_line(args: tuple[str, ...], words: str) -> None:
    done = run_cli("estimate", "--model", MODEL, "--gpus", "8", *args)
    assert done.returncode == 2
    assert words in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_train_refuses_qlora_where_it_cannot_shard_the_nf4_base() -> None:
    """The bundled trainer trains QLoRA (tests/test_trainer_qlora.py) but keeps the NF4 base
    whole on every rank, where the cost model shards it under ZeRO 3 without pipelining."""
    done = run_cli(
        "train", "--model", "tiny-llama", "--task", "qlora", "--device", "cpu", "--dp", "2",
        "--zero", "3",
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip().startswith("error: zero") or "zero:" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_estimate_with_the_task() -> None:
    full = api.estimate(MODEL, 8, GPU, gbs=32, seq_len=4096, framework="nemo")
    lora = api.estimate(MODEL, 8, GPU, gbs=32, seq_len=4096, framework="nemo", task="lora")
    assert lora["task"][0] == "lora r16 all"
    assert float(lora["pred_peak_mem_gib"][0]) < 0.6 * float(full["pred_peak_mem_gib"][0])


def test_search_with_the_task_finds_a_layout() -> None:
    result = api.search(MODEL, 8, GPU, gbs=32, seq_len=4096, framework="nemo", task="lora")
    assert result.feasible
    assert result.request.task.task is Task.LORA


def test_the_runs_table_reads_task_columns(tmp_path: Path) -> None:
    row = {
        "model": MODEL,
        "layers": 32,
        "hidden": 4096,
        "heads": 32,
        "vocab": 32000,
        "seq_len": 4096,
        "gpu": GPU,
        "num_gpus": 8,
        "tp": 1,
        "pp": 1,
        "gbs": 32,
        "framework": "nemo",
        "zero": 1,
        "recompute": "none",
    }
    runs = pd.DataFrame(
        [
            {**row, "task": "pretrain"},
            {**row, "task": "lora", "lora_rank": "32", "lora_targets": "qkv"},
            {**row, "task": "qlora"},
            {**row, "task": "lora", "lora_rank": "-3"},
        ]
    ).astype(str)
    out = api.estimate_frame(runs)
    assert out["error"][0] == "" and out["error"][1] == ""
    assert "nemo cannot run qlora" in out["error"][2]
    assert "lora-rank" in out["error"][3]
    assert float(out["pred_peak_mem_gib"][1]) < float(out["pred_peak_mem_gib"][0])
    path = tmp_path / "runs.csv"
    runs.to_csv(path, index=False)
    done = run_cli("estimate", "--runs", str(path), "--out", str(tmp_path / "out.csv"))
    assert done.returncode == 0


def test_exports_carry_the_task() -> None:
    lora = task_spec("lora", 16, "all")
    row = api.estimate(MODEL, 8, GPU, gbs=32, seq_len=4096, framework="nemo").iloc[0]
    nemo = exports.export("nemo", row, 32, 32, 4096, "bf16", task=lora)
    assert "llm.peft.LoRA(target_modules=['linear_qkv', 'linear_proj', 'linear_fc1'" in nemo
    assert "dim=16" in nemo and "finetune_recipe" in nemo
    fsdp = api.estimate(
        MODEL, 8, GPU, gbs=32, seq_len=4096, framework="torchtitan", zero=3, task="lora"
    ).iloc[0]
    titan = exports.export("torchtitan", fsdp, 32, 32, 4096, "bf16", task=lora)
    assert "LoRAConverter.Config(rank=16" in titan
    assert "lora_finetune_distributed" in titan and "model.lora_rank=16" in titan
    assert "lora_attn_modules=['q_proj', 'k_proj', 'v_proj', 'output_proj']" in titan
    sft = exports.export("megatron", row, 32, 32, 4096, "bf16", task=task_spec("sft"))
    assert "--finetune" in sft
    pretrain = exports.export("nemo", row, 32, 32, 4096, "bf16")
    assert "peft" not in pretrain


def test_pretraining_is_bit_identical_without_the_task_columns() -> None:
    x = make_inputs(MODEL, GPU, **LAYOUT)
    assert np.array_equal(evaluate(x)["pred_step_time_s"], evaluate(inputs())["pred_step_time_s"])
    assert float(evaluate(inputs(Task.LORA))["mem_weights_gib"][0]) * GIB > 0
