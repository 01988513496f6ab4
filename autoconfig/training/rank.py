"""Evaluates candidates with the cost model, prunes them (memory, user constraints), orders
them by predicted throughput, flags near-ties and explains the winner."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pandas as pd

from autoconfig import layout, resources
from autoconfig.cost import CostInputs, evaluate


def _near_tie() -> tuple[float, str]:
    """How close to the fastest a layout must be to count as a near-tie: the model's median
    error over the validation's source groups (the median over groups of each group's median
    absolute error of tokens/s/GPU, `median_over_groups_pct` in the packaged accuracy.json
    that scripts/validate_published.py writes), with where the figure comes from."""
    asset = resources.asset("accuracy.json")
    if asset.is_file():
        acc = json.loads(asset.read_text())
        if "median_over_groups_pct" in acc:
            pct = float(acc["median_over_groups_pct"])
            return pct / 100, (
                "the model's median error over the validation's source groups "
                "(accuracy.json, docs/validation.md)"
            )
    return 0.10, "10%, a stand-in: this installation has no measured accuracy"


NEAR_TIE, NEAR_TIE_SOURCE = _near_tie()
# Two layouts run at equal speed when their predictions differ by less than this: well inside
# the model's error and below the step-to-step scatter of a training run. Equal-speed layouts
# are ordered by TIE_RULES, each a (name, key: smaller is preferred) in the order applied.
EQUAL_SPEED = 0.01
MEMORY_STEP = 0.05  # memory headroom counts in steps of 5% of the limit


def _replica_across_nodes(t: pd.DataFrame, per_node: np.ndarray) -> pd.Series:
    """GPUs of one model replica (tp x cp x pp) when it spans nodes, else 0."""
    replica = t["tp"] * t["cp"] * t["pp"]
    return replica.where(replica > per_node, 0)


TIE_RULES = (
    (
        "more memory headroom",
        lambda t, _: np.floor(t["pred_peak_mem_gb"] / t["mem_limit_gb"] / MEMORY_STEP),
    ),
    ("fewer GPUs in cross-node groups", _replica_across_nodes),
    ("no context parallelism", lambda t, _: (t["cp"] > 1).astype(int)),
    ("no interleaving", lambda t, _: (t["vp"] > 1).astype(int)),
)

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
    per_node = np.broadcast_to(np.asarray(inputs.gpus_per_node), (len(out),))
    feasible = pruned == ""
    out = pd.concat(
        [
            order_ties(out[feasible], per_node[feasible.to_numpy()]),
            out[~feasible].sort_values("pred_peak_mem_gb").assign(tie_break=""),
        ],
        ignore_index=True,
    )
    n = int(feasible.sum())
    out["rank"] = pd.array([*range(1, n + 1), *([pd.NA] * (len(out) - n))], dtype="Int64")
    fastest = out["pred_tokens_per_s_per_gpu"].iloc[:n].max() if n else np.nan
    near = out["pred_tokens_per_s_per_gpu"] >= fastest * (1 - NEAR_TIE)
    out["near_tie"] = (out.index < n) & near
    return out


def order_ties(feasible: pd.DataFrame, per_node: np.ndarray | int = 8) -> pd.DataFrame:
    """Fastest first; layouts within EQUAL_SPEED of the fastest of their group are ordered by
    TIE_RULES. `tie_break` names the rule that put a layout above the next one when that one
    is at least as fast ('' where speed decided)."""
    t = feasible.assign(_per_node=np.broadcast_to(per_node, (len(feasible),)))
    t = t.sort_values(
        ["pred_tokens_per_s_per_gpu", "pred_peak_mem_gb"], ascending=[False, True]
    ).reset_index(drop=True)
    speed = t["pred_tokens_per_s_per_gpu"].to_numpy()
    group = np.zeros(len(t), int)
    head = speed[0] if len(t) else 0.0
    for i in range(1, len(t)):
        if speed[i] < head * (1 - EQUAL_SPEED):
            head = speed[i]
            group[i] = group[i - 1] + 1
        else:
            group[i] = group[i - 1]
    keys = {name: np.asarray(rule(t, t["_per_node"]), float) for name, rule in TIE_RULES}
    t = t.assign(_group=group, **{f"_tie{i}": keys[name] for i, (name, _) in enumerate(TIE_RULES)})
    cols = ["_group", *(f"_tie{i}" for i in range(len(TIE_RULES))), "pred_tokens_per_s_per_gpu"]
    t = t.sort_values(cols, ascending=[True] * (len(cols) - 1) + [False], kind="stable")
    t = t.reset_index(drop=True)
    # Each row against the next: where the next is as fast in the same group, the first tie
    # rule whose keys differ is the one that put this row above it.
    broke = np.full(len(t), "", dtype=object)
    if len(t) > 1:
        this, after = slice(0, -1), slice(1, None)
        group_col, speed_col = t["_group"].to_numpy(), t["pred_tokens_per_s_per_gpu"].to_numpy()
        open_ = (group_col[this] == group_col[after]) & (speed_col[this] <= speed_col[after])
        for j, (name, _) in enumerate(TIE_RULES):
            key = t[f"_tie{j}"].to_numpy()
            decided = open_ & (key[this] != key[after])
            broke[:-1][decided] = name
            open_ &= ~decided
    t["tie_break"] = broke
    return t.drop(columns=["_group", "_per_node", *(f"_tie{i}" for i in range(len(TIE_RULES)))])


def explain_winner(ranked: pd.DataFrame) -> str:
    """One line on why rank 1 comes before rank 2: the tie rule when they run at equal speed,
    else the step-time parts that differ most (what #1 saves, and what it pays, if anything)."""
    feasible = ranked[ranked["pruned"] == ""]
    if len(feasible) < 2:
        return "only one configuration fits" if len(feasible) == 1 else ""
    a, b = feasible.iloc[0], feasible.iloc[1]
    gain = a["pred_tokens_per_s_per_gpu"] / b["pred_tokens_per_s_per_gpu"] - 1
    mem = f"{a['pred_peak_mem_gb']:.1f} vs {b['pred_peak_mem_gb']:.1f} GiB"
    rule = a.get("tie_break", "") or ""
    if gain < EQUAL_SPEED:
        speed = (
            "equally fast"
            if abs(gain) < 1e-3
            else f"{100 * abs(gain):.1f}% {'faster' if gain > 0 else 'slower'}"
        )
        why = {
            "more memory headroom": f"more memory headroom ({mem} per GPU)",
            "fewer GPUs in cross-node groups": (
                f"fewer GPUs in cross-node groups (tp x cp x pp {_replica(a)} vs {_replica(b)})"
            ),
            "no context parallelism": f"no context parallelism (cp {a['cp']} vs {b['cp']})",
            "no interleaving": f"no interleaving (vp {a['vp']} vs {b['vp']})",
        }.get(rule, f"less memory ({mem})" if a["pred_peak_mem_gb"] < b["pred_peak_mem_gb"] else "")
        tail = f"; #1 is listed first for {why}" if why else ""
        return f"#1 and #2 run at equal speed (#1 {speed}, within {100 * EQUAL_SPEED:g}%){tail}"
    diffs = {col: float(b[col] - a[col]) for col in TIME_PARTS}
    col = max(diffs, key=lambda c: diffs[c])
    tie = " (a near-tie: within the model's error)" if gain < NEAR_TIE else ""
    line = (
        f"#1 beats #2 by {100 * gain:.1f}%{tie}: less {TIME_PARTS[col]} "
        f"({a[col]:.3f} s vs {b[col]:.3f} s per step)"
    )
    worse = min(diffs, key=lambda c: diffs[c])
    if diffs[worse] < -0.1 * diffs[col]:
        line += f", though more {TIME_PARTS[worse]} ({a[worse]:.3f} s vs {b[worse]:.3f} s)"
    return line


def _replica(row: pd.Series) -> int:
    return int(row["tp"] * row["cp"] * row["pp"])


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
        "tie broken by": row.get("tie_break", "") or "",
    }
