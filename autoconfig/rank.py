"""Evaluates candidates with the cost model, prunes them (memory, user constraints), orders
them by predicted throughput, flags near-ties and explains the winner."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from autoconfig.cost import CostInputs, evaluate
from autoconfig.cost.inputs import RECOMPUTE_CODES, hardware_columns, model_columns
from autoconfig.specs import ClusterSpec, GPUSpec, ModelSpec

# Median error of the model on published runs it was not fitted on (docs/validation.md):
# candidates closer than this to the best are reported as near-ties, not as losers.
NEAR_TIE = 0.10

TIME_PARTS = {
    "time_compute_s": "compute",
    "time_launch_s": "kernel-launch-bound time",
    "time_tp_comm_s": "exposed TP communication",
    "time_cp_comm_s": "exposed CP communication",
    "time_ep_comm_s": "exposed EP communication",
    "time_pp_comm_s": "PP communication",
    "time_bubble_s": "pipeline bubble",
    "time_dp_comm_s": "exposed DP communication",
    "time_optimizer_s": "optimizer step",
}


def cost_inputs(
    model: ModelSpec,
    gpu: GPUSpec,
    cluster: ClusterSpec,
    precision: str,
    layouts: pd.DataFrame,
    gbs: int,
    seq_len: int,
    flash: bool = True,
) -> CostInputs:
    """Cost-model columns for many layouts of one model on one GPU type."""
    cols: dict[str, object] = {**model_columns(model), **hardware_columns(gpu, cluster, precision)}
    cols.update(
        {
            "dp": layouts["dp"].to_numpy(float),
            "tp": layouts["tp"].to_numpy(float),
            "pp": layouts["pp"].to_numpy(float),
            "vp": layouts["vp"].to_numpy(float),
            "cp": layouts["cp"].to_numpy(float),
            "ep": layouts["ep"].to_numpy(float),
            "sp": layouts["sp"].to_numpy(float),
            "mbs": layouts["mbs"].to_numpy(float),
            "gbs": float(gbs),
            "seq": float(seq_len),
            "recompute": layouts["recompute"].map(RECOMPUTE_CODES).to_numpy(float),
            "recompute_layers": layouts["recompute_layers"].to_numpy(float),
            "zero": layouts["zero"].to_numpy(float),
            "fp8": float(precision == "fp8"),
            "flash": float(flash),
        }
    )
    return CostInputs.from_columns(cols)


@dataclass(frozen=True)
class Constraints:
    """User limits on top of the space: fixed values and bounds."""

    fixed: dict[str, object]
    max_tp: int | None = None
    max_pp: int | None = None
    min_dp: int | None = None
    max_memory_gb: float | None = None
    memory_headroom: float = 0.0  # fraction of capacity kept free


def rank(layouts: pd.DataFrame, inputs: CostInputs, constraints: Constraints) -> pd.DataFrame:
    """Predictions for every layout, a `pruned` reason ('' when feasible), feasible ones first
    by predicted tokens/s/GPU, and `rank` / `near_tie` for the feasible ones."""
    preds = pd.DataFrame(evaluate(inputs), index=layouts.index)
    out = pd.concat([layouts, preds], axis=1)
    pruned = pd.Series("", index=out.index, dtype=object)

    def prune(mask: pd.Series | np.ndarray, reason: str | pd.Series) -> None:
        mask = pd.Series(np.asarray(mask, bool), index=out.index) & (pruned == "")
        pruned[mask] = reason[mask] if isinstance(reason, pd.Series) else reason

    for key, value in constraints.fixed.items():
        prune(out[key].astype(str) != str(value), f"constraint: {key}={value}")
    if constraints.max_tp:
        prune(out["tp"] > constraints.max_tp, f"constraint: tp > {constraints.max_tp}")
    if constraints.max_pp:
        prune(out["pp"] > constraints.max_pp, f"constraint: pp > {constraints.max_pp}")
    if constraints.min_dp:
        prune(out["dp"] < constraints.min_dp, f"constraint: dp < {constraints.min_dp}")
    capacity = out["mem_capacity_gb"] * (1 - constraints.memory_headroom)
    if constraints.max_memory_gb:
        capacity = np.minimum(capacity, constraints.max_memory_gb)
    out["mem_limit_gb"] = capacity
    too_big = out["pred_peak_mem_gb"] > capacity
    prune(
        too_big,
        "memory: "
        + out["pred_peak_mem_gb"].round(1).astype(str)
        + " > "
        + pd.Series(capacity, index=out.index).round(1).astype(str)
        + " GiB",
    )
    out["pruned"] = pruned
    feasible = pruned == ""
    out = pd.concat(
        [
            out[feasible].sort_values(
                ["pred_tokens_per_s_per_gpu", "pred_peak_mem_gb"], ascending=[False, True]
            ),
            out[~feasible].sort_values("pred_peak_mem_gb"),
        ],
        ignore_index=True,
    )
    n = int(feasible.sum())
    out["rank"] = pd.array([*range(1, n + 1), *([pd.NA] * (len(out) - n))], dtype="Int64")
    best = out["pred_tokens_per_s_per_gpu"].iloc[0] if n else np.nan
    out["near_tie"] = (out.index < n) & (out["pred_tokens_per_s_per_gpu"] >= best * (1 - NEAR_TIE))
    return out


def explain_winner(ranked: pd.DataFrame) -> str:
    """One line on why rank 1 beats rank 2: the step-time part that differs most."""
    feasible = ranked[ranked["pruned"] == ""]
    if len(feasible) < 2:
        return "only one configuration fits" if len(feasible) == 1 else ""
    a, b = feasible.iloc[0], feasible.iloc[1]
    gain = a["pred_tokens_per_s_per_gpu"] / b["pred_tokens_per_s_per_gpu"] - 1
    if gain < 1e-3:
        return (
            f"#1 and #2 are predicted equally fast; #1 is listed first for its lower "
            f"memory ({a['pred_peak_mem_gb']:.1f} vs {b['pred_peak_mem_gb']:.1f} GiB)"
        )
    diffs = {col: b[col] - a[col] for col in TIME_PARTS}
    col = max(diffs, key=lambda c: diffs[c])
    tie = " (a near-tie: within the model's error)" if gain < NEAR_TIE else ""
    return (
        f"#1 beats #2 by {100 * gain:.1f}%{tie}: less {TIME_PARTS[col]} "
        f"({a[col]:.3f} s vs {b[col]:.3f} s per step)"
    )


def layout_labels(frame: pd.DataFrame) -> pd.Series:
    """Compact layout names, e.g. 'dp16 tp8 pp8 vp2 sp', for every row at once."""
    label = (
        "dp"
        + frame["dp"].astype(str)
        + " tp"
        + frame["tp"].astype(str)
        + " pp"
        + frame["pp"].astype(str)
    )
    for key in ("vp", "cp", "ep"):
        extra = frame[key].astype(int) > 1
        label = label.where(~extra, label + f" {key}" + frame[key].astype(str))
    return label.where(~frame["sp"].astype(bool), label + " sp")


def layout_label(row: pd.Series) -> str:
    """Compact layout name of one row."""
    return layout_labels(row.to_frame().T).iloc[0]


def recompute_label(row: pd.Series) -> str:
    if row["recompute"] != "full":
        return str(row["recompute"])
    return f"full {row['recompute_layers']}/stage"


def top_row(row: pd.Series) -> dict[str, str]:
    """The cells every view of the ranking shows for one configuration."""
    return {
        "#": str(row["rank"]),
        "layout": layout_label(row),
        "mbs": str(row["mbs"]),
        "recompute": recompute_label(row),
        "zero": str(row["zero"]),
        "tokens/s/GPU": f"{row['pred_tokens_per_s_per_gpu']:,.0f}",
        "MFU": f"{100 * row['pred_mfu']:.1f}%",
        "step s": f"{row['pred_step_time_s']:.2f}",
        "memory GiB": f"{row['pred_peak_mem_gb']:.1f}/{row['mem_limit_gb']:.0f}",
    }
