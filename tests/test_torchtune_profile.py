"""torchtune as a framework of its own: FSDP2 only (no tp, pp, cp or DDP over several GPUs),
LoRA and QLoRA, and `--emit torchtune` writes the `tune run` line of the recipe that runs it."""

from __future__ import annotations

import pytest
from helpers import assert_user_error
from helpers import run_cli as run

from autoconfig import api
from autoconfig.report import exports
from autoconfig.spec import layout
from autoconfig.spec.task import TaskSpec
from autoconfig.spec.vocab import LoraTargets, Task

ARGS = dict(gpu="a100-sxm-80gb", seq_len=2048, gbs=16, framework="torchtune")


def _feasible(result):
    return result.table[result.table["pruned"] == ""]


def test_search_proposes_only_what_torchtune_runs() -> None:
    result = api.search("llama3-8b", 8, task="qlora", **ARGS)
    table = _feasible(result)
    assert len(table) > 0
    assert (table["tp"] == 1).all() and (table["pp"] == 1).all() and (table["cp"] == 1).all()
    # FSDP2 shards every multi-GPU run: no DDP
    assert set(table["zero"].astype(int)) <= {2, 3}


def test_ddp_over_several_gpus_is_refused_with_a_reason() -> None:
    done = run(
        "estimate", "--model", "llama3-8b", "--gpus", "8", "--gpu", "a100-sxm-80gb",
        "--framework", "torchtune", "--task", "lora", "--zero", "0", "--gbs", "16",
    )  # fmt: skip
    assert_user_error(done, "zero", "torchtune shards every data-parallel run")


def test_one_gpu_runs_unsharded() -> None:
    result = api.search("llama3-8b", 1, task="qlora", **{**ARGS, "gbs": 2})
    assert 0 in set(_feasible(result)["zero"].astype(int))


def test_pretraining_is_not_a_torchtune_recipe() -> None:
    with pytest.raises(Exception, match="task"):
        api.search("llama3-8b", 8, task="pretrain", **ARGS)


def _row(dp: int, zero: int, **extra) -> dict:
    return {**layout.plain(layout.Layout(dp=dp, zero=zero, mbs=2).model_dump()), **extra}


@pytest.mark.parametrize(
    ("dp", "task", "head"),
    [
        (
            8,
            Task.QLORA,
            "tune run --nproc_per_node 8 lora_finetune_distributed --config <model>_qlora",
        ),
        (1, Task.LORA, "tune run lora_finetune_single_device --config <model>_lora_single_device"),
        (
            4,
            Task.SFT,
            "tune run --nproc_per_node 4 full_finetune_distributed --config <model>_full",
        ),
    ],
)
def test_emit_picks_the_recipe(dp: int, task: Task, head: str) -> None:
    spec = TaskSpec(task=task, lora_rank=8, lora_targets=LoraTargets.ALL)
    text = exports.export(
        "torchtune", _row(dp, 3 if dp > 1 else 0), 32, 16 * dp, 2048, "bf16", task=spec
    )
    assert text.splitlines()[0].startswith(head)
    assert f"gradient_accumulation_steps={16 // 2}" in text
    if task is not Task.SFT:
        assert "model.lora_rank=8" in text and "model.apply_lora_to_mlp=True" in text


def test_emit_refuses_ddp() -> None:
    with pytest.raises(Exception, match="zero 0 runs on one GPU only"):
        exports.export("torchtune", _row(8, 0), 32, 128, 2048, "bf16")


def test_emit_spans_nodes_and_fuses_the_offloaded_optimizer() -> None:
    row = _row(16, 3, offload="optimizer+params")
    text = exports.export("torchtune", row, 80, 32, 2048, "bf16", task=TaskSpec(task=Task.SFT))
    assert text.startswith("tune run --nnodes 2 --nproc_per_node 8 full_finetune_distributed")
    assert "fsdp_cpu_offload=True" in text and "optimizer.fused=True" in text
    with pytest.raises(Exception, match="do not fill whole nodes of 8"):
        exports.export("torchtune", _row(12, 3), 80, 24, 2048, "bf16")
