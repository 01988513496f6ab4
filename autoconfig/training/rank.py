"""Evaluates candidates with the cost model, prunes them (memory, user constraints), orders
them by predicted throughput, flags near-ties and explains the winner."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from autoconfig import layout
from autoconfig.cost import CostInputs, evaluate

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
        plain = layout.BY_NAME[key].plain(value)
        prune(out[key] != plain, f"constraint: {key}={plain}")
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


def top_row(row: pd.Series) -> dict[str, str]:
    """The cells every view of the ranking shows for one configuration."""
    return {
        "#": str(row["rank"]),
        "layout": layout.label(row),
        "mbs": str(row["mbs"]),
        "recompute": layout.recompute_label(row),
        "zero": str(row["zero"]),
        "tokens/s/GPU": f"{row['pred_tokens_per_s_per_gpu']:,.0f}",
        "MFU": f"{100 * row['pred_mfu']:.1f}%",
        "step s": f"{row['pred_step_time_s']:.2f}",
        "memory GiB": f"{row['pred_peak_mem_gb']:.1f}/{row['mem_limit_gb']:.0f}",
    }
