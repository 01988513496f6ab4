"""Checks the AMD Instinct profiles against the published AMD runs (amd_training_runs.csv).

The MI300X and MI325X profiles are timed by the H200 tables and the MI350X and MI355X by the
B200 tables, each at its own datasheet peaks, with the constants every chip shares; their GEMMs
(and MI300X's and MI325X's attention) at AMD's measured GEMM efficiency over the stand-in's
(columns.gemm_rates, from AMD's aiter tuning tables). These rows were not used to fit
anything; they are the only check of that stand-in. Rows go through the same path as the NVIDIA
validation (`validation.predictions`).

What the rows ran that their columns do not say, or that the model cannot describe, is stated
here once with its source, as `validation.SOURCE_FACTS` does for the NVIDIA rows.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from autoconfig.calibrate import validation
from autoconfig.columns import gemm_rates, kernel_index
from autoconfig.spec import catalog

RUNS_FILE = "amd_training_runs.csv"
AMD_GPUS = ("mi300x", "mi325x", "mi350x", "mi355x")
TARGET_MEDIAN_APE = 0.20  # issue 38: "amd_training_runs.csv: median APE <= 20%"


# MangoBoost's MLPerf llama2_70b_lora submissions (LLMBoost 1.1.0, 1.2.0) are configured by the
# same variables as AMD's NeMo/Megatron-based reference implementation (config_MI300X_*x8x1.sh:
# TP, PP, CP, MBS, MINIBS, FP8, FP8_ACTIVATION; the rows' notes), so they are read as NeMo runs.
# An inference from their configuration files, not a statement of MangoBoost's.
FRAMEWORK_AS = {"llmboost": "nemo"}

# Rows the model cannot describe, by the start of their source group, with the reason.
NOT_PREDICTED = {
    "Primus hybrid-models guide": (
        "linear attention (Gated DeltaNet, Kimi Delta Attention blocks): the model describes "
        "softmax attention, MLA and Mamba-2 mixers only, and timing these as softmax attention "
        "would charge a quadratic cost they do not run"
    ),
}

# The LoRA settings the MLPerf rows logged (rank 16 in the rows' task and notes); the targets
# are the attention projections, q, k, v and o (the MLPerf llama2_70b_lora reference's
# lora_target_modules "qkv_proj,o_proj", the NeMo-based implementations' linear_qkv and
# linear_proj; as recalled: the rows do not state them).
LORA_FACTS = {"lora_targets": "attention"}
PRETRAIN = "pretrain"


def runs_path(path: Path | None = None) -> Path:
    return path or validation.require_reference_dir() / RUNS_FILE


def load_amd_runs(path: Path | None = None) -> pd.DataFrame:
    """The AMD rows as text, with the columns the validation reads: the task as its first word
    (the CSV writes "lora (rank 16, logged)") and the rank it names, frameworks read as
    FRAMEWORK_AS says, every row `ok` (all ran), and the blank columns the NVIDIA table has."""
    runs = validation.read_reference(runs_path(path), {}, "source_group")
    text = runs.get("task", pd.Series("", index=runs.index)).astype(str).str.strip().str.lower()
    runs["task"] = text.str.split().str[0].fillna("").replace("", PRETRAIN)
    rank = text.map(lambda t: m.group(1) if (m := re.search(r"rank (\d+)", t)) else "")
    stated = runs.get("lora_rank", pd.Series("", index=runs.index)).astype(str).str.strip()
    runs["lora_rank"] = stated.where(stated != "", rank)
    tuned = runs["task"] != PRETRAIN
    for column, value in LORA_FACTS.items():
        if column not in runs:
            runs[column] = ""
        runs.loc[tuned & (runs[column] == ""), column] = value
    runs["published_framework"] = runs["framework"]
    runs["framework"] = runs["framework"].str.strip().str.lower().replace(FRAMEWORK_AS)
    # the measured figures validation.measured_throughput falls back on, blank where unpublished
    for column in ("measured_mfu", "measured_model_tflops_per_gpu", "status"):
        if column not in runs:
            runs[column] = ""
    runs["status"] = runs["status"].replace("", "ok")
    runs["fit_set"] = False  # nothing was fitted on these rows
    return runs


def task_is_read(runs: pd.DataFrame) -> tuple[bool, str]:
    """Whether the row reader times a fine-tuning task (LoRA) apart from pre-training: the
    tuned rows predicted with their task and again as pre-training must differ somewhere; else
    the reason they cannot be predicted yet."""
    tuned = runs[runs["task"] != PRETRAIN]
    if tuned.empty:
        return True, ""
    with np.errstate(all="ignore"):
        as_given = validation.predictions(tuned)
        as_pretrain = validation.predictions(tuned.assign(task=PRETRAIN))
    refused = as_given["error"].str.contains("task|lora", case=False, regex=True)
    if refused.all():
        return False, f"the row reader refuses the task: {as_given['error'].iloc[0]}"
    both = (as_given["error"] == "") & (as_pretrain["error"] == "")
    given = as_given.loc[both, "pred_tokens_per_s_per_gpu"].astype(float)
    plain = as_pretrain.loc[both, "pred_tokens_per_s_per_gpu"].astype(float)
    if both.any() and np.allclose(given.to_numpy(), plain.to_numpy(), rtol=1e-9):
        return False, (
            "the row reader does not read a `task` column yet (a LoRA row is timed as full "
            "pre-training: every weight with gradients and Adam state)"
        )
    return True, ""


def amd_guess(runs: pd.DataFrame) -> pd.Series:
    """The constant-MFU guess at each row's own GPU (validation.constant_guess, which holds the
    AMD parts' dense bf16 peaks)."""
    return validation.constant_guess(runs)


def amd_predictions(runs: pd.DataFrame) -> pd.DataFrame:
    """Every row with its prediction, the guess at its own GPU and `outcome`: `predicted`, or
    `pending: ...` (the fine-tuning task is not read yet), or `not predicted: ...`."""
    runs = runs.reset_index(drop=True)
    with np.errstate(all="ignore"):
        out = validation.predictions(runs)
        out["guess_tps"] = amd_guess(runs).to_numpy()
    out["guess_ape"] = (out["guess_tps"] / out["measured_tps"] - 1).abs()
    outcome = pd.Series("predicted", index=out.index, dtype=object)
    read, why = task_is_read(runs)
    if not read:
        outcome[runs["task"] != PRETRAIN] = f"pending: {why}"
    for group, reason in NOT_PREDICTED.items():
        outcome[runs["source_group"].str.startswith(group)] = f"not predicted: {reason}"
    failed = (outcome == "predicted") & (out["error"] != "")
    outcome[failed] = "not predicted: " + out.loc[failed, "error"]
    out["outcome"] = outcome
    scored = out["outcome"] == "predicted"
    for column in ("pred_tokens_per_s_per_gpu", "ape"):
        out[column] = out[column].where(scored)
    return out


def _summary(g: pd.DataFrame) -> dict[str, object]:
    scored = g[g["outcome"] == "predicted"]
    return {
        "rows": len(g),
        "predicted": len(scored),
        "median_ape_%": 100 * scored["ape"].median() if len(scored) else np.nan,
        "guess_median_ape_%": 100 * scored["guess_ape"].median() if len(scored) else np.nan,
        "not_predicted": "; ".join(
            sorted({short_outcome(o) for o in g["outcome"] if o != "predicted"})
        ),
    }


def short_outcome(outcome: str) -> str:
    """An outcome's reason up to its first colon or parenthesis, for a table cell."""
    head, colon, rest = outcome.partition(": ")
    if not colon:
        return outcome
    return f"{head}: {re.split(r'[:(]', rest)[0].strip()}"


def gpu_table(out: pd.DataFrame) -> pd.DataFrame:
    """One line per AMD GPU profile (a GPU without rows shows 0 rows)."""
    gpus = out["gpu"].str.lower()
    return pd.DataFrame([{"gpu": gpu, **_summary(out[gpus == gpu])} for gpu in AMD_GPUS])


def group_table(out: pd.DataFrame) -> pd.DataFrame:
    """One line per (source group, GPU)."""
    rows = [
        {"source_group": group, "gpu": gpu, **_summary(g)}
        for (group, gpu), g in out.groupby(["source_group", "gpu"], sort=True)
    ]
    return pd.DataFrame(rows)


def headline(out: pd.DataFrame) -> dict[str, object]:
    scored = out[out["outcome"] == "predicted"]
    median = float(scored["ape"].median()) if len(scored) else float("nan")
    return {
        "rows": len(out),
        "predicted": len(scored),
        "pending": int(out["outcome"].str.startswith("pending").sum()),
        "not_predicted": int(out["outcome"].str.startswith("not predicted").sum()),
        "median_ape_%": 100 * median,
        "guess_median_ape_%": 100 * float(scored["guess_ape"].median()),
        "target_median_ape_%": 100 * TARGET_MEDIAN_APE,
        "meets_target": bool(median <= TARGET_MEDIAN_APE),
    }


ROW_COLUMNS = [
    "run_id",
    "gpu",
    "task",
    "published_framework",
    "measured_tps",
    "pred_tokens_per_s_per_gpu",
    "ape",
    "guess_tps",
    "guess_ape",
    "outcome",
]


def row_table(out: pd.DataFrame) -> pd.DataFrame:
    table = out[ROW_COLUMNS].copy()
    # a row the reader refused has no measured_tps; its published figure still shows
    published = pd.to_numeric(out["measured_tokens_per_s_per_gpu"], errors="coerce")
    table["measured_tps"] = table["measured_tps"].fillna(published)
    for column in ("ape", "guess_ape"):
        table[column] = 100 * table[column]
    return table.rename(
        columns={
            "published_framework": "framework",
            "measured_tps": "measured",
            "pred_tokens_per_s_per_gpu": "predicted",
            "ape": "ape_%",
            "guess_tps": "guess",
            "guess_ape": "guess_ape_%",
        }
    )


def rate_table() -> pd.DataFrame:
    """Each AMD GPU's measured GEMM efficiency over its stand-in table's, by format: the
    median over the measured shapes with the least and greatest shape's."""
    rows = []
    for name in AMD_GPUS:
        gpu = catalog.get_gpu(name)
        peaks = kernel_index.stand_in_peaks(gpu)
        for fmt, r in gemm_rates.gemm_ratios(gpu, peaks).items():
            rows.append(
                {
                    "gpu": name,
                    "stand_in": gpu.kernel_table,
                    "compute_units": gpu.sms,
                    "format": fmt,
                    "shapes": r.shapes,
                    "ratio": r.ratio,
                    "least": r.low,
                    "greatest": r.high,
                }
            )
    return pd.DataFrame(rows)


def same_die_pairs(out: pd.DataFrame) -> pd.DataFrame:
    """Rows of one source group run in the same layout on two AMD parts with the same compute
    units (MI300X and MI325X, MI350X and MI355X): the measured and predicted throughput of the
    second over the first. What the model gives the pair is what the datasheet figures it uses
    differ by; a measured ratio beyond it is what those figures do not say (most likely the
    sustained clock under each part's board power)."""
    scored = out[out["outcome"] == "predicted"].copy()
    scored["compute_units"] = scored["gpu"].map(lambda g: catalog.get_gpu(g).sms)
    layout = ["source_group", "compute_units", "num_gpus", "tp", "pp", "cp", "mbs", "gbs"]
    rows = []
    for key, g in scored.groupby(layout, sort=True, dropna=False):
        if g["gpu"].nunique() != 2:
            continue
        first, second = (g[g["gpu"] == gpu].iloc[0] for gpu in sorted(g["gpu"].unique()))
        rows.append(
            {
                "source_group": key[0],
                "pair": f"{second['gpu']} / {first['gpu']}",
                "gpus": int(first["num_gpus"]),
                "measured_ratio": second["measured_tps"] / first["measured_tps"],
                "predicted_ratio": second["pred_tokens_per_s_per_gpu"]
                / first["pred_tokens_per_s_per_gpu"],
            }
        )
    return pd.DataFrame(rows)
