"""Compares predictions with published measurements (shared by the validation and fit scripts).

What the published runs ran that the CSV has no column for is stated here once, with its
source, and applied as input columns: these are facts about the runs, not corrections.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import spearmanr

from autoconfig.cost import evaluate
from autoconfig.cost.flops import model_flops_per_token
from autoconfig.errors import UserError
from autoconfig.frame import read_training_rows, with_predictions

# Runs from before FlashAttention (Dao et al., May 2022) used Megatron's unfused softmax
# attention; Megatron GPT models train with dropout 0.1 (Megatron-LM arguments.py defaults
# hidden_dropout/attention_dropout = 0.1), BLOOM with dropout 0 (BLOOM paper, Sec. 3.3); the
# 2021-era Megatron and DeepSpeed stacks all-reduced gradients after the backward pass
# (overlap_grad_reduce arrived with the distributed optimizer in Megatron-Core).
SOURCE_FACTS: dict[str, dict[str, str]] = {
    "Megatron-LM 2021 Table 1 (A100)": {
        "flash_attention": "n",
        "dropout": "y",
        "overlap_grad_reduce": "n",
    },
    "Korthikanti 2022": {"flash_attention": "n", "dropout": "y", "overlap_grad_reduce": "n"},
    "MT-NLG": {"flash_attention": "n", "dropout": "y", "overlap_grad_reduce": "n"},
    "BLOOM": {"flash_attention": "n", "dropout": "n", "overlap_grad_reduce": "n"},
}

# torchtitan's `activation_checkpoint.mode = "selective"` defaults to selective_ac_option "op"
# (torchtitan docs, activation checkpointing): op-level checkpointing, not Megatron's
# attention-only selective recompute.
RECOMPUTE_MEANING: dict[str, dict[str, str]] = {"torchtitan": {"selective": "op"}}

SIXTEEN_BIT = ("bf16", "fp16")
MAIN_GPUS = ("a100-sxm-40gb", "a100-sxm-80gb", "h100-sxm-80gb", "h100-sxm-96gb", "h200-sxm-141gb")


REFERENCE_ENV = "AUTOCONFIG_REFERENCE"  # a folder holding training_runs.csv, inference_runs.csv


def reference_dir() -> Path | None:
    """The published measurements: $AUTOCONFIG_REFERENCE, else ../shared/reference beside the
    checkout (the current folder's or the package's); None when there are none."""
    env = os.environ.get(REFERENCE_ENV)
    candidates = [Path(env)] if env else []
    for base in (Path.cwd(), Path(__file__).resolve().parent.parent):
        candidates += [base.parent / "shared" / "reference", base / "shared" / "reference"]
    return next((c for c in candidates if (c / "training_runs.csv").exists()), None)


def require_reference_dir() -> Path:
    found = reference_dir()
    if found is None:
        raise UserError(
            "reference: no published measurements found (../shared/reference beside the "
            f"checkout, or ${REFERENCE_ENV})"
        )
    return found


def in_fit_set(run_id: str) -> bool:
    """The calibration subset: a fixed third of the rows, chosen by a hash of run_id."""
    return int(hashlib.sha256(run_id.encode()).hexdigest(), 16) % 3 == 0


def read_reference(path: Path, facts: dict[str, dict[str, str]], key: str) -> pd.DataFrame:
    """A reference table as text, with the stated facts written into the rows whose `key`
    column names their source (a fact's column is added blank where the CSV lacks it)."""
    runs = pd.read_csv(path, dtype=str, keep_default_na=False)
    for source, values in facts.items():
        for col, value in values.items():
            if col not in runs:
                runs[col] = ""
            runs.loc[runs[key] == source, col] = value
    return runs


def load_training_runs(path: Path | None = None) -> pd.DataFrame:
    runs = read_reference(
        path or require_reference_dir() / "training_runs.csv", SOURCE_FACTS, "source_group"
    )
    for group, meaning in RECOMPUTE_MEANING.items():
        rows = runs["source_group"] == group
        runs.loc[rows, "recompute"] = runs.loc[rows, "recompute"].replace(meaning)
    runs["fit_set"] = runs["run_id"].map(in_fit_set)
    return runs


def measured_throughput(runs: pd.DataFrame) -> pd.Series:
    """Measured tokens/s/GPU; where only MFU or model TFLOP/s were published, converted with
    the same model-FLOPs count the predictions use (both follow Megatron's convention)."""
    rows = read_training_rows(runs)
    inputs, errors = rows.inputs(), rows.errors
    with np.errstate(all="ignore"):
        flops = pd.Series(
            np.broadcast_to(model_flops_per_token(inputs), len(runs)), index=runs.index
        )
        peak = pd.Series(np.broadcast_to(inputs.peak_flops, len(runs)), index=runs.index)
    num = lambda c: pd.to_numeric(runs[c], errors="coerce")  # noqa: E731
    tokens = num("measured_tokens_per_s_per_gpu")
    from_tflops = num("measured_model_tflops_per_gpu") * 1e12 / flops
    from_mfu = num("measured_mfu") * peak / flops
    return tokens.fillna(from_tflops).fillna(from_mfu).where(errors == "")


def predictions(runs: pd.DataFrame) -> pd.DataFrame:
    """Every row with its predictions, `error`, the measured throughput and the error."""
    runs = runs.reset_index(drop=True)
    rows = read_training_rows(runs)
    with np.errstate(all="ignore"):
        out = with_predictions(runs, evaluate(rows.inputs()), rows.errors)
    out["measured_tps"] = measured_throughput(runs).to_numpy()
    out["ape"] = (out["pred_tokens_per_s_per_gpu"].astype(float) / out["measured_tps"] - 1).abs()
    return out


def error_stats(ape: pd.Series) -> dict[str, float]:
    ape = ape.dropna()
    return {
        "rows": len(ape),
        "mape_%": 100 * ape.mean(),
        "median_ape_%": 100 * ape.median(),
        "within_20%": 100 * (ape <= 0.2).mean(),
    }


def throughput_table(out: pd.DataFrame) -> pd.DataFrame:
    ok = out[(out["status"] == "ok") & out["measured_tps"].notna() & (out["error"] == "")]
    rows = []
    for prec_name, prec in (("16-bit", SIXTEEN_BIT), ("fp8", ("fp8",))):
        sel = ok[ok["precision"].isin(prec) & ok["gpu"].isin(MAIN_GPUS)]
        for group, g in sel.groupby("source_group"):
            rows.append({"precision": prec_name, "source_group": group, **error_stats(g["ape"])})
        rows.append({"precision": prec_name, "source_group": "ALL", **error_stats(sel["ape"])})
        rows.append(
            {
                "precision": prec_name,
                "source_group": "ALL (held out)",
                **error_stats(sel.loc[~sel["fit_set"], "ape"]),
            }
        )
    return pd.DataFrame(rows)


def playbook_ranking(out: pd.DataFrame) -> pd.DataFrame:
    """Within each (model, GPU count) group of the Ultra-Scale Playbook sweep: Spearman rank
    correlation of predicted vs measured throughput, and the measured loss from running the
    predicted best instead of the measured best."""
    pb = out[
        (out["source_group"] == "Ultra-Scale Playbook")
        & (out["status"] == "ok")
        & out["measured_tps"].notna()
        & (out["error"] == "")
    ]
    rows = []
    for (model, gpus), g in pb.groupby(["model", "num_gpus"]):
        if len(g) < 3:
            continue
        rho = spearmanr(g["pred_tokens_per_s_per_gpu"].astype(float), g["measured_tps"])[0]
        pick = g.loc[g["pred_tokens_per_s_per_gpu"].astype(float).idxmax(), "measured_tps"]
        rows.append(
            {
                "model": model,
                "num_gpus": int(gpus),
                "configs": len(g),
                "spearman": rho,
                "loss_%": 100 * (1 - pick / g["measured_tps"].max()),
            }
        )
    return pd.DataFrame(rows)


# What fixes a training run's speed in the reference table, short of the ZeRO stage.
LAYOUT = [
    "source_group",
    "model",
    "gpu",
    "num_gpus",
    "tp",
    "pp",
    "vp",
    "cp",
    "ep",
    "dp",
    "sp",
    "mbs",
    "gbs",
    "seq_len",
    "precision",
    "recompute",
]


# Sweeps in which every setting that varies between runs is a column of the table (the
# torchtitan rows, by contrast, differ in torch.compile, async TP and float8 only in `notes`).
SWEEPS = ("Ultra-Scale Playbook",)


def repeat_spread(
    runs: pd.DataFrame, measured: pd.Series, groups: tuple[str, ...] = SWEEPS
) -> pd.DataFrame:
    """How far apart the measured throughputs of one layout lie, without any model:

    - *repeated*: the same layout and ZeRO stage measured more than once (max / min);
    - *ZeRO-0 vs ZeRO-1*: one layout measured with both. ZeRO-1 replaces the data-parallel
      all-reduce by a reduce-scatter and an all-gather of the same bytes and shards only the
      optimizer step (Rajbhandari et al. 2020, "ZeRO", Sec. 5 and 7), so the two should agree
      within a few per cent.

    A pair more than 1.5x apart cannot both lie within +-20% of one prediction (1.2 / 0.8 =
    1.5): that is the floor on the error any model that predicts them alike must show.
    """
    keep = (runs["status"] == "ok") & measured.notna() & runs["source_group"].isin(groups)
    ok = runs.assign(measured=measured, zero=runs["zero"].astype(str)).loc[keep]
    stats = ok.groupby([*LAYOUT, "zero"], dropna=False)["measured"].agg(
        ["count", "min", "max", "median"]
    )
    repeats = stats[stats["count"] > 1]
    by_zero = stats["median"].unstack("zero").reindex(columns=["0", "1"]).dropna()
    frame = pd.concat(
        [
            pd.DataFrame(
                {
                    "comparison": "repeated",
                    "source_group": repeats.index.get_level_values("source_group"),
                    "ratio": (repeats["max"] / repeats["min"]).to_numpy(),
                }
            ),
            pd.DataFrame(
                {
                    "comparison": "ZeRO-0 vs ZeRO-1",
                    "source_group": by_zero.index.get_level_values("source_group"),
                    "ratio": (by_zero.max(axis=1) / by_zero.min(axis=1)).to_numpy(),
                }
            ),
        ]
    )
    rows = []
    for (kind, group), g in frame.groupby(["comparison", "source_group"]):
        rows.append(
            {
                "comparison": kind,
                "source_group": group,
                "pairs": len(g),
                "median_ratio": g["ratio"].median(),
                "over_1.2x_%": 100 * (g["ratio"] > 1.2).mean(),
                "over_1.5x_%": 100 * (g["ratio"] > 1.5).mean(),
                "over_2x_%": 100 * (g["ratio"] > 2.0).mean(),
            }
        )
    return pd.DataFrame(rows)


def fits_table(out: pd.DataFrame) -> pd.DataFrame:
    valid = out[out["error"] == ""]
    rows = []
    for status, want in (("ok", True), ("crash_or_oom", False), ("oom", False)):
        g = valid[valid["status"] == status]
        if len(g):
            agree = (g["pred_fits"].astype(bool) == want).mean()
            rows.append(
                {
                    "status": status,
                    "rows": len(g),
                    "predicted_" + ("fit" if want else "not_fit") + "_%": 100 * agree,
                }
            )
    return pd.DataFrame(rows)


def memory_table(out: pd.DataFrame) -> pd.DataFrame:
    meas = pd.to_numeric(out["measured_peak_mem_gb"], errors="coerce")
    sel = out[meas.notna() & (out["error"] == "")]
    ape = (sel["pred_peak_mem_gb"].astype(float) / meas[sel.index] - 1).abs()
    rows = [
        {"source_group": grp, **error_stats(ape[g.index])} for grp, g in sel.groupby("source_group")
    ]
    rows.append({"source_group": "ALL", **error_stats(ape)})
    rows.append({"source_group": "ALL (held out)", **error_stats(ape[~sel["fit_set"]])})
    return pd.DataFrame(rows)
