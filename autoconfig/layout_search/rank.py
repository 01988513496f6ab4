"""Evaluates candidates with the cost model, prunes them (memory, user constraints), orders
them by the conservative end of their predicted throughput's spread (layout_search/spread.py),
puts memory-risky near-ties below safe ones, flags near-ties and explains the winner."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pandas as pd

from autoconfig.base import resources
from autoconfig.cost import CostInputs, evaluate
from autoconfig.layout_search import spread
from autoconfig.spec import layout


def _near_tie() -> tuple[float, str]:
    """How close to the best a layout's conservative estimate must be to count as a near-tie:
    the model's median error over the published source groups each predicted by constants
    fitted without it (the median over groups of each group's median absolute error of
    tokens/s/GPU, `left_out_median_over_groups_pct` in the packaged accuracy.json that
    scripts/validate_left_out.py writes), with where the figure comes from. The in-sample
    figure (`median_over_groups_pct`) is the fit judging rows it saw, so it only stands in
    where the left-out one is missing."""
    asset = resources.asset("accuracy.json")
    acc = json.loads(asset.read_text()) if asset.is_file() else {}
    if "left_out_median_over_groups_pct" in acc:
        return float(acc["left_out_median_over_groups_pct"]) / 100, (
            "the model's median error over the source groups, each predicted by a refit that "
            "left it out (accuracy.json, docs/validation_left_out.md)"
        )
    if "median_over_groups_pct" in acc:
        return float(acc["median_over_groups_pct"]) / 100, (
            "the model's in-sample median error over the validation's source groups "
            "(accuracy.json, docs/validation.md; no left-out figure in this installation)"
        )
    return 0.10, "10%, a stand-in: this installation has no measured accuracy"


NEAR_TIE, NEAR_TIE_SOURCE = _near_tie()
SPREAD = spread.load()
# What the ranking sorts by: the conservative end of each layout's spread, so that a layout
# whose regime the model over-predicts cannot top the list on optimism alone.
RANK_BY = "pred_tokens_per_s_per_gpu_low"
POINT = "pred_tokens_per_s_per_gpu"
# Two layouts run at equal speed when their estimates differ by less than this: well inside
# the model's error and below the step-to-step scatter of a training run. Equal-speed layouts
# are ordered by TIE_RULES, each a (name, key: smaller is preferred) in the order applied.
EQUAL_SPEED = 0.01
MEMORY_STEP = 0.05  # memory headroom counts in steps of 5% of the limit
# Among near-ties (within NEAR_TIE of each other), a layout without memory risk goes above one
# with it: the rule's name, as `tie_break` shows it.
MEMORY_RISK_RULE = "no memory risk"


def _replica_across_nodes(t: pd.DataFrame, per_node: np.ndarray) -> pd.Series:
    """GPUs of one model replica (tp x cp x pp) when it spans nodes, else 0."""
    replica = t["tp"] * t["cp"] * t["pp"]
    return replica.where(replica > per_node, 0)


TIE_RULES = (
    (
        "more memory headroom",
        lambda t, _: np.floor(t["pred_peak_mem_gib"] / t["mem_limit_gib"] / MEMORY_STEP),
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
    "time_offload_s": "CPU offload (host link, CPU Adam, activations)",
}


@dataclass(frozen=True)
class Constraints:
    """User limits on top of the space: fixed values and bounds."""

    fixed: dict[str, object]
    max_tp: int | None = None
    max_pp: int | None = None
    min_dp: int | None = None
    max_memory_gib: float | None = None
    memory_headroom: float = 0.0  # fraction of capacity kept free


def with_spread(out: pd.DataFrame, gpus_per_node: object) -> pd.DataFrame:
    """`out` with each layout's conservative (RANK_BY) and optimistic estimates and its error
    regime: SPREAD over the regimes its layout falls in."""
    per_node = np.broadcast_to(np.asarray(gpus_per_node, float), (len(out),))
    low, high, by = SPREAD.band(out[POINT], spread.regimes(out, per_node))
    out[RANK_BY], out["pred_tokens_per_s_per_gpu_high"], out["spread_regime"] = low, high, by
    return out


def memory_limit_gib(capacity_gib: pd.Series | np.ndarray, constraints: Constraints) -> np.ndarray:
    """The memory a layout may use per GPU: the GPU's capacity less the headroom, at most
    --max-memory-gib."""
    limit = np.asarray(capacity_gib, float) * (1 - constraints.memory_headroom)
    if constraints.max_memory_gib:
        limit = np.minimum(limit, constraints.max_memory_gib)
    return limit


def rank(
    layouts: pd.DataFrame,
    inputs: CostInputs,
    constraints: Constraints,
    predictions: dict[str, np.ndarray] | None = None,
) -> pd.DataFrame:
    """Predictions for every layout with their spread (`pred_tokens_per_s_per_gpu_low` /
    `_high`, the regime that set the low end in `spread_regime`) and `memory_risk`, a
    `pruned` reason ('' when feasible), feasible ones first by the conservative estimate,
    and `rank` / `near_tie` for the feasible ones. `predictions`: the cost model's columns
    for `layouts` where the caller has them already."""
    preds = pd.DataFrame(
        predictions if predictions is not None else evaluate(inputs), index=layouts.index
    )
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
    capacity = memory_limit_gib(out["mem_capacity_gib"], constraints)
    out["mem_limit_gib"] = capacity
    too_big = out["pred_peak_mem_gib"] > capacity
    prune(
        too_big,
        "memory: "
        + out["pred_peak_mem_gib"].round(1).astype(str)
        + " > "
        + pd.Series(capacity, index=out.index).round(1).astype(str)
        + " GiB",
    )
    # CPU offload fills host memory: checked where the cluster profile states it (NaN: never)
    if "mem_host_gib" in out:
        host = out["mem_host_gib"].astype(float)
        host_limit = out["host_capacity_gib"].astype(float)
        prune(
            host > host_limit,
            "host memory: "
            + host.round(1).astype(str)
            + " > "
            + host_limit.round(1).astype(str)
            + " GiB per GPU offloaded",
        )
    out["pruned"] = pruned
    per_node = np.broadcast_to(np.asarray(inputs.gpus_per_node, float), (len(out),))
    out = with_spread(out, per_node)
    # against the GPU's capacity, not the user's limit: the risk is running out of HBM
    out["memory_risk"] = SPREAD.memory_risk(out["pred_peak_mem_gib"], out["mem_capacity_gib"])
    feasible = pruned == ""
    out = pd.concat(
        [
            order_ties(out[feasible], per_node[feasible.to_numpy()]),
            out[~feasible].sort_values("pred_peak_mem_gib").assign(tie_break=""),
        ],
        ignore_index=True,
    )
    n = int(feasible.sum())
    out["rank"] = pd.array([*range(1, n + 1), *([pd.NA] * (len(out) - n))], dtype="Int64")
    fastest = out[RANK_BY].iloc[:n].max() if n else np.nan
    near = out[RANK_BY] >= fastest * (1 - NEAR_TIE)
    out["near_tie"] = (out.index < n) & near
    return out


def _chain(speed: np.ndarray, band: float, start: np.ndarray) -> np.ndarray:
    """Group ids over `speed` (sorted fastest first within each run of rows that `start`
    opens): a row joins the group of the head it follows unless it is more than `band` below
    that head's speed, or `start` marks a new segment."""
    group = np.zeros(len(speed), int)
    head = speed[0] if len(speed) else 0.0
    for i in range(1, len(speed)):
        if start[i] or speed[i] < head * (1 - band):
            head = speed[i]
            group[i] = group[i - 1] + 1
        else:
            group[i] = group[i - 1]
    return group


def order_ties(feasible: pd.DataFrame, per_node: np.ndarray | int = 8) -> pd.DataFrame:
    """Best conservative estimate first (the point prediction where a table has none).
    Layouts within NEAR_TIE of the best of their near-tie band put those without
    `memory_risk` first; then layouts within EQUAL_SPEED of the best of their group are
    ordered by TIE_RULES. `tie_break` names the rule that put a layout above the nearest one
    listed below it that is at least as fast ('' where no such layout is: speed decided), so
    every break of the order by the conservative estimate is named (_tie_breaks)."""
    key = RANK_BY if RANK_BY in feasible else POINT
    risk = (
        feasible["memory_risk"].astype(bool)
        if "memory_risk" in feasible
        else pd.Series(False, index=feasible.index)
    )
    t = feasible.assign(
        _per_node=np.broadcast_to(per_node, (len(feasible),)), _risk=risk.astype(int)
    )
    t = t.sort_values([key, "pred_peak_mem_gib"], ascending=[False, True]).reset_index(drop=True)
    none = np.zeros(len(t), bool)
    t["_band"] = _chain(t[key].to_numpy(float), NEAR_TIE, none)
    # Within a near-tie band the safe layouts come first (a named rule: they may be up to
    # NEAR_TIE slower); bands themselves stay in speed order.
    t = t.sort_values(["_band", "_risk"], kind="stable").reset_index(drop=True)
    band, risk_col = t["_band"].to_numpy(), t["_risk"].to_numpy()
    segment = np.r_[False, (band[1:] != band[:-1]) | (risk_col[1:] != risk_col[:-1])]
    group = _chain(t[key].to_numpy(float), EQUAL_SPEED, segment)
    keys = {name: np.asarray(rule(t, t["_per_node"]), float) for name, rule in TIE_RULES}
    t = t.assign(_group=group, **{f"_tie{i}": keys[name] for i, (name, _) in enumerate(TIE_RULES)})
    cols = ["_group", *(f"_tie{i}" for i in range(len(TIE_RULES))), key]
    t = t.sort_values(cols, ascending=[True] * (len(cols) - 1) + [False], kind="stable")
    t = t.reset_index(drop=True)
    t["tie_break"] = _tie_breaks(t, key)
    helpers = ["_group", "_band", "_risk", "_per_node"]
    return t.drop(columns=[*helpers, *(f"_tie{i}" for i in range(len(TIE_RULES)))])


def _tie_breaks(t: pd.DataFrame, key: str) -> np.ndarray:
    """For each row of the ordered table `t`, the rule that put it above the nearest row listed
    below it that is at least as fast ('' where no row below is: speed decided): no memory risk
    when that one is at risk in the same near-tie band, else the first tie rule whose keys
    differ in their equal-speed group. Every row above a faster one says why, not only a row
    above the next, and where the next row is at least as fast, the rule is the one against it."""
    n = len(t)
    broke = np.full(n, "", dtype=object)
    if n < 2:
        return broke
    speed = t[key].to_numpy(float).tolist()
    # The nearest row below at least as fast: one pass from the end keeping a stack of the
    # rows no row between them and the current one outruns.
    nearest = np.full(n, -1)
    stack: list[int] = []
    for row in range(n - 1, -1, -1):
        while stack and speed[stack[-1]] < speed[row]:
            stack.pop()
        if stack:
            nearest[row] = stack[-1]
        stack.append(row)
    i = np.flatnonzero(nearest >= 0)
    j = nearest[i]
    band, risk, group = (t[c].to_numpy() for c in ("_band", "_risk", "_group"))
    by_risk = (band[i] == band[j]) & (risk[i] < risk[j])
    broke[i[by_risk]] = MEMORY_RISK_RULE
    open_ = ~by_risk & (group[i] == group[j])
    for k, (name, _) in enumerate(TIE_RULES):
        tie_key = t[f"_tie{k}"].to_numpy()
        decided = open_ & (tie_key[i] != tie_key[j])
        broke[i[decided]] = name
        open_ &= ~decided
    return broke


def explain_winner(ranked: pd.DataFrame) -> str:
    """One line on why rank 1 comes before rank 2: memory risk or the tie rule when they are
    (near-)ties, else the step-time parts that differ most (what #1 saves, and what it pays,
    if anything). Speeds compare the conservative estimates the ranking sorts by (the point
    predictions where a table has none)."""
    feasible = ranked[ranked["pruned"] == ""]
    if len(feasible) < 2:
        return "only one configuration fits" if len(feasible) == 1 else ""
    key = RANK_BY if RANK_BY in feasible else POINT
    a, b = feasible.iloc[0], feasible.iloc[1]
    gain = a[key] / b[key] - 1
    mem = f"{a['pred_peak_mem_gib']:.1f} vs {b['pred_peak_mem_gib']:.1f} GiB"
    # #1's rule is the one against #2 only where #2 is at least as fast (else it names why #1
    # is above a faster layout further down)
    rule = (a.get("tie_break", "") or "") if b[key] >= a[key] else ""
    if rule == MEMORY_RISK_RULE:
        return (
            f"#2 is {100 * -gain:.1f}% faster by the conservative estimate, a near-tie (within "
            f"{100 * NEAR_TIE:g}%), but its predicted peak ({b['pred_peak_mem_gib']:.1f} of "
            f"{b['mem_capacity_gib']:.1f} GiB) leaves less headroom than the measured peak "
            f"error; #1 is listed first for {MEMORY_RISK_RULE} ({a['pred_peak_mem_gib']:.1f} GiB)"
        )
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
        }.get(
            rule, f"less memory ({mem})" if a["pred_peak_mem_gib"] < b["pred_peak_mem_gib"] else ""
        )
        tail = f"; #1 is listed first for {why}" if why else ""
        return f"#1 and #2 run at equal speed (#1 {speed}, within {100 * EQUAL_SPEED:g}%){tail}"
    diffs = {col: float(b[col] - a[col]) for col in TIME_PARTS}
    col = max(diffs, key=lambda c: diffs[c])
    tie = " (a near-tie: within the model's error)" if gain < NEAR_TIE else ""
    by = " by the conservative estimate" if key == RANK_BY else ""
    line = (
        f"#1 beats #2 by {100 * gain:.1f}%{by}{tie}: less {TIME_PARTS[col]} "
        f"({a[col]:.3f} s vs {b[col]:.3f} s per step)"
    )
    worse = min(diffs, key=lambda c: diffs[c])
    if diffs[worse] < -0.1 * diffs[col]:
        line += f", though more {TIME_PARTS[worse]} ({a[worse]:.3f} s vs {b[worse]:.3f} s)"
    return line


def _replica(row: pd.Series) -> int:
    return int(row["tp"] * row["cp"] * row["pp"])


# The column of the quantity the ranking sorts by, as every view of it is headed.
RANK_COLUMN = "tokens/s/GPU low (ranked by)"
MEMORY_COLUMN = "memory GiB (peak of limit)"


def top_row(row: pd.Series) -> dict[str, str]:
    """The cells every view of the ranking shows for one configuration: the quantity it is
    ranked by (RANK_COLUMN) before the point estimate, MFU as a percentage, memory as the
    peak of the limit in GiB (the GPU's usable capacity less any headroom or
    --max-memory-gib), with one decimal as estimate shows it."""
    low = row.get(RANK_BY)
    return {
        "#": str(row["rank"]),
        "layout": layout.label(row),
        "mbs": str(row["mbs"]),
        "recompute": layout.recompute_label(row),
        "zero": str(row["zero"]),
        RANK_COLUMN: "" if low is None or pd.isna(low) else f"{low:,.0f}",
        "tokens/s/GPU": f"{row['pred_tokens_per_s_per_gpu']:,.0f}",
        "tokens/s/GPU (low-high)": _spread_cell(row),
        "MFU": f"{100 * row['pred_mfu']:.1f}%",
        "step s": f"{row['pred_step_time_s']:.2f}",
        MEMORY_COLUMN: f"{row['pred_peak_mem_gib']:.1f} of {row['mem_limit_gib']:.1f}",
        "memory risk": "yes" if bool(row.get("memory_risk", False)) else "",
        "tie broken by": row.get("tie_break", "") or "",
    }


def _spread_cell(row: pd.Series) -> str:
    """The conservative and optimistic estimates of one row ('' for a table without them)."""
    if RANK_BY not in row or pd.isna(row[RANK_BY]):
        return ""
    return f"{row[RANK_BY]:,.0f}-{row['pred_tokens_per_s_per_gpu_high']:,.0f}"
