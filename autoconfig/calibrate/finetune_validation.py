"""The cost model held against published fine-tuning runs (../shared/reference/finetune_runs.csv:
full SFT, LoRA and QLoRA): per source group the median APE of tokens/s/GPU with the shipped
constants and with the group left out of the time fit, beside the constant-MFU guess.

What the runs ran that the CSV has no column for is stated here once, with its source, and
applied as input cells (as validation.SOURCE_FACTS does): facts about runs, not corrections.
No fine-tuning row is in the time fit (scripts/fit_profiles.py fits training_runs.csv), so a
group's left-out prediction is its shipped one.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from autoconfig.calibrate.validation import (
    constant_guess,
    error_stats,
    read_reference,
    require_reference_dir,
)
from autoconfig.cost import evaluate
from autoconfig.rows.resolve import read_resolved
from autoconfig.rows.training import with_predictions
from autoconfig.spec import catalog

# Per source group. torchtune runs as its own profile (profiles/frameworks/torchtune.yaml: FSDP2,
# LoRA and QLoRA, pure bf16 training, hence the bf16 Adam state). The frameworks without a
# profile of their own run as the profile whose physics they share: NeMo AutoModel and prime-rl
# train with PyTorch FSDP2 (fully_shard) and DTensor tensor parallelism, as torchtitan does
# (AutoModel's README: "PyTorch FSDP2"; prime-rl's trainer shards with fully_shard), hence
# ZeRO 3 on more than one GPU and none on one.
SOURCE_FACTS: dict[str, dict[str, str]] = {
    # NeMo 24.07's LoRA runs: the NeMo 1 PEFT path of that release adapts attention_qkv by
    # default (nemo-toolkit 2.0.0rc1, nlp/parts/peft_config.py get_target_modules default
    # ("attention_qkv",)) with adapter_dim 32 (llm.peft.LoRA dim 32 in the same release).
    # The table: "we use SQuAD-v1.1 dataset, and the inputs are packed to 4096 tokens" (the
    # row's `packed` y); NeMo's packed SFT runs Transformer Engine's THD (variable-length)
    # attention, each example attending within itself: the squad preset's lengths, an
    # estimate (spec.documents).
    "NeMo 24.07 perf summary": {"lora_targets": "qkv", "lora_rank": "32", "doc_lengths": "squad"},
    # examples/llm_benchmark/*_peft_benchmark.yaml: target_modules '*_proj' (every linear of a
    # layer), dim 16 (the row's lora_rank); the table's FSDP column is dp.
    "NeMo AutoModel perf summary (LoRA, H100)": {
        "framework": "torchtitan",
        "lora_targets": "all",
        "zero": "3",
    },
    # The older table's VP cell is in a shifted column (the row's notes), so its interleaving
    # is not known: taken as 1F1B without virtual stages, the pipeline's plain schedule.
    "NeMo AutoModel perf summary (LoRA, H100, older PP configs)": {
        "framework": "torchtitan",
        "lora_targets": "all",
        "zero": "3",
        "vp": "1",
    },
    # torchtune 0.6.1 recipes/configs/llama3_1/{8B,70B}_lora*.yaml, 405B_qlora.yaml and
    # llama3_2/3B_{lora,qlora}_single_device.yaml: lora_attn_modules q_proj, v_proj,
    # output_proj with apply_lora_to_mlp (every linear but k_proj: `all`, k_proj's adapter
    # is r (h + kv) parameters more); README: "batch size 2 (without gradient accumulation)",
    # torch.compile on (fused elementwise kernels); the distributed configs set
    # enable_activation_checkpointing True.
    "torchtune README": {
        "framework": "torchtune",
        "optimizer_state": "bf16",
        "lora_targets": "all",
        "tp": "1",
        "pp": "1",
        "fused_kernels": "y",
        "recompute": "full",
    },
    # The optimization-flags table: Llama 3.2 3B, one A100, batch 2, max_seq_len 4096, bf16,
    # techniques added in table order (rows' `recompute` and `fused_kernels` below).
    "torchtune README (optimization flags)": {
        "framework": "torchtune",
        "optimizer_state": "bf16",
        "lora_targets": "all",
        "tp": "1",
        "pp": "1",
        "zero": "0",
    },
    # prime-rl --bench: FSDP2, AC=Recompute (full), one 'micro batch' of one sequence per GPU
    # per published step; bf16 (prime-rl trains in bf16; the table does not say).
    "prime-rl --bench (SFT Full)": {
        "framework": "torchtitan",
        "tp": "1",
        "pp": "1",
        "recompute": "full",
        "precision": "bf16",
    },
}

# Per run: what only some rows of a group ran.
ROW_FACTS: dict[str, dict[str, str]] = {
    # torchtune's 8-GPU rows: FSDP over 8 GPUs, 2 sequences per GPU, no accumulation (README).
    # The 70B full run: "** = Uses CPU offload with fused optimizer" (README), torchtune 0.6.1
    # recipes/configs/llama3_1/70B_full.yaml fsdp_cpu_offload True: FSDP2's CPUOffloadPolicy,
    # parameters, gradients and optimizer state on the host (cost.offload), whose CPU Adam the
    # model times on fp32 state (cost.offload runs no lighter host state): an overcount of
    # the bf16 run's host bytes.
    "tt_llama31_70b_full_8xa100": {
        "zero": "3",
        "gbs": "16",
        "offload": "optimizer+params",
        "optimizer_state": "fp32",
    },
    "tt_llama31_70b_lora_8xa100": {"zero": "3", "gbs": "16", "lora_rank": "16"},
    "tt_llama31_405b_qlora_8xa100": {"zero": "3", "gbs": "16", "lora_rank": "16"},
    "tt_llama31_8b_lora_4090": {"zero": "0", "lora_rank": "8"},
    "tt_llama31_8b_lora_a6000": {"zero": "0", "lora_rank": "8"},
    "tt_llama31_8b_qlora_4090": {"zero": "0", "lora_rank": "8"},
    "tt_llama31_8b_full_4090": {"zero": "0"},
    "tt_llama31_8b_full_a6000": {"zero": "0"},
    # The optimization-flags table, cumulative: compile from '+ Compile' on, full activation
    # checkpointing from '+ Activation Checkpointing' on, activation offload from '+ Activation
    # Offloading' on; LoRA and QLoRA keep all three (they leave out only optimizer-in-backward
    # and AdamW8bit; 3B_lora_single_device.yaml: lora_rank 64).
    "tt_llama32_3b_full_baseline": {"recompute": "none", "fused_kernels": "n"},
    "tt_llama32_3b_full_packed": {"recompute": "none", "fused_kernels": "n"},
    "tt_llama32_3b_full_compile": {"recompute": "none", "fused_kernels": "y"},
    "tt_llama32_3b_full_chunkedce": {"recompute": "none", "fused_kernels": "y"},
    "tt_llama32_3b_full_actckpt": {"recompute": "full", "fused_kernels": "y"},
    "tt_llama32_3b_full_optinbwd": {"recompute": "full", "fused_kernels": "y"},
    "tt_llama32_3b_full_actoffload": {
        "recompute": "full",
        "fused_kernels": "y",
        "activation_offload": "y",
    },
    "tt_llama32_3b_full_adamw8bit": {
        "recompute": "full",
        "fused_kernels": "y",
        "activation_offload": "y",
    },
    "tt_llama32_3b_lora": {
        "recompute": "full",
        "fused_kernels": "y",
        "activation_offload": "y",
        "lora_rank": "64",
    },
    "tt_llama32_3b_qlora": {
        "recompute": "full",
        "fused_kernels": "y",
        "activation_offload": "y",
        "lora_rank": "64",
    },
}

# Qwen3's attention heads are 128 wide whatever the hidden size (Qwen3-0.6B, -4B and -30B-A3B
# config.json: head_dim 128), the small ones tie their embeddings (tie_word_embeddings true),
# and the MoE's experts are 768 wide (moe_intermediate_size 768). Keyed by the start of `model`.
MODEL_FACTS: dict[str, dict[str, str]] = {
    "Qwen3-0.6B": {"head_dim": "128", "tied_embeddings": "y"},
    "Qwen3-4B": {"head_dim": "128", "tied_embeddings": "y"},
    "Qwen3-30B-A3B": {"head_dim": "128", "moe_ffn_hidden": "768"},
}

# What a group's runs did that the model does not have yet, named where its rows miss.
MISSING_OPS: dict[str, str] = {
    "torchtune README": "pure bf16 training keeps no fp32 remainder beside the bf16 Adam "
    "state (2 bytes a parameter the model charges); the RTX A6000 rows exceed the datasheet: "
    "2,579 tokens/s/GPU of full 8B fine-tuning is 80% of its 154.8 TFLOP/s at 6 FLOPs a "
    "parameter a token, and 4,699 of LoRA is 97% at 4",
    "torchtune README (optimization flags)": "padding waste of the unpacked baseline (its "
    "dataset's lengths are not published), chunked cross-entropy, optimizer-in-backward, "
    "AdamW8bit",
    "prime-rl --bench (SFT Full)": "unknown: the runs reach 11-17% MFU (as published), half "
    "what the model gives FSDP2 with full recompute at these shapes; a published 'step' is "
    "one micro-batch",
    "NeMo AutoModel perf summary (LoRA, H100, older PP configs)": "the 70B pipelined runs at "
    "half the predicted rate (an older pipeline schedule whose interleaving is not known)",
}


def load_finetune_runs(path: Path | None = None) -> pd.DataFrame:
    """finetune_runs.csv as text, with the facts above written into its cells; `status` ok."""
    runs = read_reference(
        path or require_reference_dir() / "finetune_runs.csv", SOURCE_FACTS, "source_group"
    )
    for run_id, values in ROW_FACTS.items():
        for col, value in values.items():
            if col not in runs:
                runs[col] = ""
            runs.loc[runs["run_id"] == run_id, col] = value
    for prefix, values in MODEL_FACTS.items():
        rows = runs["model"].str.startswith(prefix)
        for col, value in values.items():
            if col not in runs:
                runs[col] = ""
            runs.loc[rows & (runs[col] == ""), col] = value
    # prime-rl's published step is one micro-batch of one sequence on every GPU
    prime = (runs["source_group"] == "prime-rl --bench (SFT Full)") & (runs["gbs"] == "")
    runs.loc[prime, "gbs"] = runs.loc[prime, "num_gpus"]
    # FSDP2 shards over more than one GPU (ZeRO 3); one GPU shards nothing
    fsdp = runs["source_group"] == "prime-rl --bench (SFT Full)"
    runs.loc[fsdp, "zero"] = np.where(runs.loc[fsdp, "num_gpus"] == "1", "0", "3")
    runs["status"] = "ok"
    return runs


def predictions(runs: pd.DataFrame) -> pd.DataFrame:
    """Every row with its prediction (unknown settings resolved as the framework would run
    them), `error`, whether its GPU is in the catalog, the measured throughput, the constant
    guess and both absolute errors."""
    runs = runs.reset_index(drop=True)
    rows, resolved = read_resolved(runs)
    with np.errstate(all="ignore"):
        out = with_predictions(runs, evaluate(rows.inputs()), rows.errors)
    out = pd.concat([out, resolved], axis=1)
    known = {name.lower() for name in catalog.gpus()}
    out["gpu_in_catalog"] = runs["gpu"].str.lower().isin(known).to_numpy()
    out["measured_tps"] = pd.to_numeric(runs["measured_tokens_per_s_per_gpu"], errors="coerce")
    out["ape"] = (out["pred_tokens_per_s_per_gpu"].astype(float) / out["measured_tps"] - 1).abs()
    out["guess_tps"] = constant_guess(runs).to_numpy()
    out["guess_ape"] = (out["guess_tps"] / out["measured_tps"] - 1).abs()
    return out


def group_table(out: pd.DataFrame) -> pd.DataFrame:
    """Per source group: rows, rows predicted, rows on GPUs the catalog lacks, rows refused
    for another reason, the median APE in sample and left out (equal: no fine-tuning row is
    in the time fit), the constant guess's median APE on the same rows, and the missing op."""
    table = []
    for group, g in out.groupby("source_group", sort=False):
        predicted = g[g["ape"].notna()]
        stats, guess = error_stats(predicted["ape"]), error_stats(predicted["guess_ape"])
        table.append(
            {
                "source_group": group,
                "rows": len(g),
                "predicted": len(predicted),
                "gpu_not_in_catalog": int((~g["gpu_in_catalog"]).sum()),
                "refused": int((g["gpu_in_catalog"] & (g["error"] != "")).sum()),
                "median_ape_%": stats["median_ape_%"],
                "left_out_median_ape_%": stats["median_ape_%"],
                "guess_median_ape_%": guess["median_ape_%"],
                "missing": MISSING_OPS.get(str(group), ""),
            }
        )
    return pd.DataFrame(table)


def refusals(out: pd.DataFrame) -> pd.DataFrame:
    """The rows not predicted and why (a GPU the catalog lacks, or the row's first error)."""
    bad = out[out["ape"].isna()]
    return pd.DataFrame(
        {
            "run_id": bad["run_id"],
            "gpu": bad["gpu"],
            "why": np.where(
                bad["gpu_in_catalog"], bad["error"], "GPU not in the catalog (no profile)"
            ),
        }
    )
