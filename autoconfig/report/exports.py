"""Launch settings for a chosen configuration: Megatron-LM flags, a NeMo 2.0 recipe override,
and a torchtitan TOML parallelism section."""

from __future__ import annotations

import pandas as pd


def megatron(row: pd.Series, layers: int, gbs: int, seq_len: int, precision: str) -> str:
    flags = [
        f"--tensor-model-parallel-size {row['tp']}",
        f"--pipeline-model-parallel-size {row['pp']}",
        f"--context-parallel-size {row['cp']}",
        f"--micro-batch-size {row['mbs']}",
        f"--global-batch-size {gbs}",
        f"--seq-length {seq_len}",
    ]
    pp = int(row["pp"])
    if pp > 1 and layers % pp:
        # Uneven split: every stage but the last holds ceil(L/pp) layers.
        flags.append(f"--decoder-last-pipeline-num-layers {layers - (pp - 1) * -(-layers // pp)}")
    if int(row["vp"]) > 1:
        flags.append(
            f"--num-layers-per-virtual-pipeline-stage {layers // (int(row['pp']) * int(row['vp']))}"
        )
    if int(row["ep"]) > 1:
        flags.append(f"--expert-model-parallel-size {row['ep']}")
    if bool(row["sp"]):
        flags.append("--sequence-parallel")
    if row["recompute"] in ("selective", "op"):
        # Megatron has no op-level SAC; its selective recompute is the nearest setting.
        flags.append("--recompute-granularity selective")
    elif row["recompute"] == "full":
        flags += [
            "--recompute-granularity full",
            "--recompute-method block",
            f"--recompute-num-layers {row['recompute_layers']}",
        ]
    if int(row["zero"]) >= 3:
        flags.append("--use-torch-fsdp2")
    elif int(row["zero"]) >= 1:
        flags += ["--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather"]
    flags.append("--fp8-format hybrid --bf16" if precision == "fp8" else f"--{precision}")
    flags.append("--use-flash-attn")
    return " \\\n  ".join(flags)


def nemo(row: pd.Series, layers: int, gbs: int, seq_len: int, precision: str) -> str:
    lines = [
        "# NeMo 2.0: apply to a recipe, e.g. recipe = llm.llama3_70b.pretrain_recipe(...)",
        f"recipe.trainer.strategy.tensor_model_parallel_size = {row['tp']}",
        f"recipe.trainer.strategy.pipeline_model_parallel_size = {row['pp']}",
        "recipe.trainer.strategy.virtual_pipeline_model_parallel_size = "
        + (str(row["vp"]) if int(row["vp"]) > 1 else "None"),
        f"recipe.trainer.strategy.context_parallel_size = {row['cp']}",
        f"recipe.trainer.strategy.expert_model_parallel_size = {row['ep']}",
        f"recipe.trainer.strategy.sequence_parallel = {bool(row['sp'])}",
        f"recipe.data.micro_batch_size = {row['mbs']}",
        f"recipe.data.global_batch_size = {gbs}",
        f"recipe.data.seq_length = {seq_len}",
    ]
    if row["recompute"] == "full":
        lines += [
            'recipe.model.config.recompute_granularity = "full"',
            'recipe.model.config.recompute_method = "block"',
            f"recipe.model.config.recompute_num_layers = {row['recompute_layers']}",
        ]
    elif row["recompute"] in ("selective", "op"):
        lines.append('recipe.model.config.recompute_granularity = "selective"')
    if int(row["zero"]) >= 1:
        lines.append("recipe.trainer.strategy.ddp.use_distributed_optimizer = True")
    if precision == "fp8":
        lines.append("recipe.trainer.plugins = bf16_with_fp8_mixed()")
    return "\n".join(lines)


def torchtitan(row: pd.Series, layers: int, gbs: int, seq_len: int, precision: str) -> str:
    shard = int(row["dp"]) if int(row["zero"]) >= 2 else 1
    replicate = int(row["dp"]) // shard
    schedule = "Interleaved1F1B" if int(row["vp"]) > 1 else "1F1B"
    mode = {"none": "none", "selective": "selective", "full": "full", "op": "selective"}[
        row["recompute"]
    ]
    lines = [
        "[parallelism]",
        f"data_parallel_replicate_degree = {replicate}",
        f"data_parallel_shard_degree = {shard}",
        f"tensor_parallel_degree = {row['tp']}",
        f"pipeline_parallel_degree = {row['pp']}",
        f'pipeline_parallel_schedule = "{schedule}"',
        f"context_parallel_degree = {row['cp']}",
        f"expert_parallel_degree = {row['ep']}",
        "",
        "[training]",
        f"local_batch_size = {gbs // int(row['dp'])}",
        f"global_batch_size = {gbs}",
        f"seq_len = {seq_len}",
        "",
        "[activation_checkpoint]",
        f'mode = "{mode}"',
    ]
    if row["recompute"] == "op":
        lines.append('selective_ac_option = "op"')
    if int(row["pp"]) > 1:
        lines.insert(7, f"pipeline_parallel_microbatch_size = {row['mbs']}")
    if precision == "fp8":
        lines += ["", "[float8]", "enable_fsdp_float8_all_gather = true"]
    return "\n".join(lines)


EXPORTERS = {"megatron": megatron, "nemo": nemo, "torchtitan": torchtitan}
