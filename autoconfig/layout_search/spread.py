"""The model's out-of-sample error carried into every prediction: which error regimes a layout
is in, the quantiles of the left-out signed log ratio per regime with each source group
weighted once (scripts/validate_left_out.py writes them to left_out_spread.json), the
conservative (low) and optimistic (high) tokens/s/GPU they give, and the memory-risk flag."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pandas as pd

from autoconfig.base import resources

ASSET = "left_out_spread.json"
# The regimes a row can be in, with what each means. The three pipeline-depth regimes split
# every row; the other three add to it. "base" is every left-out row: the spread a regime
# with too few source groups falls back to.
REGIMES = {
    "pp 1": "no pipeline",
    "pp 2-8": "pipeline of 2 to 8 stages",
    "pp > 8": "pipeline of more than 8 stages",
    "tp x cp across nodes": "tp x cp GPUs span nodes (TP or CP traffic on the network)",
    "zero-3 across nodes": "ZeRO-3 whose dp x cp group (tp apart) spans nodes",
    "memory > 90%": "predicted peak memory above 90% of the GPU's capacity",
}
BASE = "base"
MEMORY_PRESSURE = 0.90  # the "memory > 90%" regime's share of capacity
MIN_GROUPS = 3  # fewer source groups than this in a regime: its spread is the base one
LEVELS = (0.1, 0.2, 0.5, 0.8, 0.9)  # quantiles of log(pred/measured) the asset keeps
# The conservative estimate is the prediction times the 20th percentile of measured/predicted,
# i.e. divided by exp of the 80th percentile of log(pred/measured); the optimistic one uses
# the 20th percentile of the log ratio. One in five left-out runs of the regime did worse
# than `low` relative to its prediction (groups weighted once).
CONSERVATIVE_LEVEL = 0.8
OPTIMISTIC_LEVEL = 0.2


def regimes(t: pd.DataFrame, per_node: np.ndarray | pd.Series | float) -> pd.DataFrame:
    """Which regimes each row of `t` (tp, cp, pp, dp, zero, pred_peak_mem_gib, mem_capacity_gib)
    is in, one boolean column per REGIMES entry. A group spans nodes when its GPUs, spaced as
    in cost.comm.group_links, exceed a node: tp x cp for TP and CP (CP ranks sit tp apart),
    dp x cp x tp for ZeRO-3's gathers over the dp x cp ranks."""
    node = np.asarray(per_node, float)
    pp, tp, cp = t["pp"].to_numpy(float), t["tp"].to_numpy(float), t["cp"].to_numpy(float)
    dp, zero = t["dp"].to_numpy(float), t["zero"].to_numpy(float)
    peak, capacity = t["pred_peak_mem_gib"].to_numpy(float), t["mem_capacity_gib"].to_numpy(float)
    flags = {
        "pp 1": pp <= 1,
        "pp 2-8": (pp > 1) & (pp <= 8),
        "pp > 8": pp > 8,
        "tp x cp across nodes": tp * cp > node,
        "zero-3 across nodes": (zero == 3) & (dp * cp * tp > node),
        "memory > 90%": peak > MEMORY_PRESSURE * capacity,
    }
    return pd.DataFrame(flags, index=t.index)


def weighted_quantiles(
    values: np.ndarray | pd.Series, groups: np.ndarray | pd.Series, levels: tuple[float, ...]
) -> np.ndarray:
    """Quantiles of `values` where each group weighs once in all (a row 1/its group's size),
    NaN values left out; each row sits at the middle of its weight on the cumulative scale,
    interpolated between rows (the weighted form of the usual midpoint quantile)."""
    v = np.asarray(values, float)
    g = np.asarray(groups, object)
    keep = ~np.isnan(v)
    v, g = v[keep], g[keep]
    if not len(v):
        return np.full(len(levels), np.nan)
    sizes = pd.Series(g).map(pd.Series(g).value_counts()).to_numpy(float)
    order = np.argsort(v, kind="stable")
    v, w = v[order], 1.0 / sizes[order]
    at = (np.cumsum(w) - w / 2) / w.sum()
    return np.interp(levels, at, v)


def regime_spreads(left_out: pd.DataFrame) -> dict[str, dict]:
    """Per regime (and `base`, every row): rows, source groups and the group-weighted
    quantiles (LEVELS) of `log_ratio` over `left_out`'s rows with a ratio; a regime with
    fewer than MIN_GROUPS groups carries the base quantiles and says so in `fallback`."""
    rows = left_out[left_out["log_ratio"].notna()]

    def stats(part: pd.DataFrame) -> dict:
        q = weighted_quantiles(part["log_ratio"], part["source_group"], LEVELS)
        return {
            "rows": len(part),
            "groups": int(part["source_group"].nunique()),
            "groups_named": sorted(part["source_group"].unique().tolist()),
            "quantiles": {
                f"{level:g}": round(float(x), 4) for level, x in zip(LEVELS, q, strict=True)
            },
        }

    base = stats(rows)
    out = {BASE: base | {"means": "every left-out row", "fallback": ""}}
    for name, means in REGIMES.items():
        own = stats(rows[rows[name].astype(bool)])
        entry = own | {"means": means, "fallback": ""}
        if own["groups"] < MIN_GROUPS:
            entry["own_quantiles"] = own["quantiles"]
            entry["quantiles"] = base["quantiles"]
            entry["fallback"] = f"base: {own['groups']} source groups, fewer than {MIN_GROUPS}"
        out[name] = entry
    return out


@dataclass(frozen=True)
class Spread:
    """Per regime the log(pred/measured) quantiles the band uses, and the share of a GPU's
    capacity above which a predicted peak is a memory risk; with where they come from."""

    conservative: dict[str, float]  # regime -> CONSERVATIVE_LEVEL quantile of the log ratio
    optimistic: dict[str, float]  # regime -> OPTIMISTIC_LEVEL quantile
    safe_share: float  # a predicted peak above this share of capacity is a memory risk
    source: str
    memory_source: str

    def band(self, pred: pd.Series, flags: pd.DataFrame) -> tuple[pd.Series, pd.Series, pd.Series]:
        """The conservative and optimistic tokens/s/GPU of each prediction, and the regime
        that set the conservative side. A row in several regimes takes, on each side, the
        farthest quantile any of them gives (the union of their bands)."""
        names = [n for n in REGIMES if n in self.conservative and n in flags]
        if not names:
            base_hi = self.conservative.get(BASE, 0.0)
            base_lo = self.optimistic.get(BASE, 0.0)
            return (
                pred * np.exp(-base_hi),
                pred * np.exp(-base_lo),
                pd.Series(BASE, index=pred.index, dtype=object),
            )
        inside = flags[names].to_numpy(bool)
        hi = np.where(inside, [self.conservative[n] for n in names], -np.inf)
        lo = np.where(inside, [self.optimistic[n] for n in names], np.inf)
        # a row in no regime (cannot happen with the pp regimes, but flags may be partial)
        hi_max = np.where(inside.any(axis=1), hi.max(axis=1), self.conservative.get(BASE, 0.0))
        lo_min = np.where(inside.any(axis=1), lo.min(axis=1), self.optimistic.get(BASE, 0.0))
        by = np.where(inside.any(axis=1), np.array(names, object)[hi.argmax(axis=1)], BASE)
        return (
            pred * np.exp(-hi_max),
            pred * np.exp(-lo_min),
            pd.Series(by, index=pred.index, dtype=object),
        )

    def memory_risk(self, peak: pd.Series, capacity: pd.Series) -> pd.Series:
        """Where the predicted peak leaves less headroom than the measured peak error."""
        return pd.Series(
            np.asarray(peak, float) > self.safe_share * np.asarray(capacity, float),
            index=peak.index,
        )


STAND_IN_SHARE = 0.90  # only where the asset lacks the measured figure


def load() -> Spread:
    """The packaged spread (left_out_spread.json); without it a +-10% band and a 90% memory
    line, each saying it is a stand-in."""
    asset = resources.asset(ASSET)
    data = json.loads(asset.read_text()) if asset.is_file() else {}
    spreads = data.get("regimes", {})
    cons = {n: float(s["quantiles"][f"{CONSERVATIVE_LEVEL:g}"]) for n, s in spreads.items()}
    opt = {n: float(s["quantiles"][f"{OPTIMISTIC_LEVEL:g}"]) for n, s in spreads.items()}
    memory = data.get("memory", {})
    if cons:
        source = (
            "the 20th-80th percentile of measured/predicted over the published source groups, "
            "each predicted by a refit that left it out, per regime, groups weighted once "
            f"({ASSET}, scripts/validate_left_out.py)"
        )
    else:
        cons, opt = {BASE: float(np.log(1 / 0.9))}, {BASE: float(np.log(1 / 1.1))}
        source = "+-10%, a stand-in: this installation has no measured spread"
    if "safe_share" in memory:
        share, mem_source = float(memory["safe_share"]), str(memory["source"])
    else:
        share, mem_source = STAND_IN_SHARE, "90% of capacity, a stand-in: no measured figure"
    return Spread(cons, opt, share, source, mem_source)
