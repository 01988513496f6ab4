"""What a sweep's measured steps pay per micro-batch, with no model involved.

A family of runs (one model, GPU count, tp, pp, dp, ZeRO stage, global batch and sequence)
measured at several micro-batch sizes processes the same tokens per step at each: only how the
global batch is cut changes. Larger micro-batches run somewhat more efficient kernels and,
pipelined, a smaller bubble; what a micro-batch costs whatever its size (kernel launches,
collective latencies) is small. A straight line in the number of micro-batches (step = a + c m,
m = gbs / (dp mbs)) with a large slope c is a fixed cost per micro-batch far above those: a
stall, not work. The model's own line over the same layouts is beside, for contrast.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike
from scipy.stats import linregress

FAMILY = ["model", "num_gpus", "gpus_per_node", "tp", "pp", "dp", "zero", "gbs", "seq_len"]
NUMERIC = ["num_gpus", "gpus_per_node", "tp", "pp", "dp", "mbs", "gbs", "seq_len"]
DEFAULT_NODE = 8  # GPUs per node where a row leaves it blank (every H100/A100 source here)


def step_line(micro: ArrayLike, step: ArrayLike) -> tuple[float, float]:
    """(slope in seconds per micro-batch, R^2) of a least-squares line through step times
    against micro-batches per step (R^2 NaN where the steps do not vary)."""
    with np.errstate(all="ignore"):
        fit = linregress(micro, step)
    return float(fit.slope), float(fit.rvalue**2)


def kind(tp: float, pp: float, dp: float, node: float) -> str:
    """Where a layout's communication runs: TP inside a node or across nodes; with pipelining,
    whether every hop between neighbouring stages (tp*dp ranks apart, Megatron's and
    nanotron's rank order) crosses nodes, or only some or none do."""
    if tp > node:
        return "tp across nodes"
    if pp == 1:
        return "pp 1, tp in a node"
    if tp * dp < node:
        return "pipelined, some or no stage hops cross nodes"
    return "pipelined, every stage hop crosses nodes"


def micro_batch_lines(
    out: pd.DataFrame, group: str, min_sizes: int = 3, min_span: float = 4.0
) -> pd.DataFrame:
    """Per family of `group`'s completed runs measured at `min_sizes` or more micro-batch
    sizes spanning `min_span`x or more: the measured line (seconds per micro-batch, R^2), the
    slowest step over the fastest, the share of the slowest step the fixed per-micro-batch
    cost makes up, and the model's slope over the same runs (`out` as from
    validation.predictions)."""
    ok = out[(out["source_group"] == group) & (out["status"] == "ok")]
    ok = ok[ok["measured_tps"].notna() & (ok["error"] == "")]
    num = ok[NUMERIC].apply(pd.to_numeric, errors="coerce")
    num["gpus_per_node"] = num["gpus_per_node"].fillna(DEFAULT_NODE)
    frame = num.assign(
        model=ok["model"],
        zero=ok["zero"].astype(str),
        step=num["gbs"] * num["seq_len"] / (ok["measured_tps"] * num["num_gpus"]),
        predicted=pd.to_numeric(ok["pred_step_time_s"], errors="coerce"),
        micro=num["gbs"] / (num["dp"] * num["mbs"]),
    )
    rows = []
    for key, g in frame.groupby(FAMILY, dropna=False):
        sizes = g.groupby("mbs").agg(
            step=("step", "median"), predicted=("predicted", "median"), micro=("micro", "first")
        )
        if len(sizes) < min_sizes or sizes.index.max() / sizes.index.min() < min_span:
            continue
        slope, r2 = step_line(sizes["micro"], sizes["step"])
        model_slope, _ = step_line(sizes["micro"], sizes["predicted"])
        family = dict(zip(FAMILY, key, strict=True))
        most = sizes["micro"].idxmax()  # the smallest micro-batch: the most of them
        rows.append(
            family
            | {
                "kind": kind(family["tp"], family["pp"], family["dp"], family["gpus_per_node"]),
                "sizes": len(sizes),
                "slope_s": slope,
                "r2": r2,
                "slowest_over_fastest": sizes["step"].max() / sizes["step"].min(),
                "fixed_share": slope * sizes.loc[most, "micro"] / sizes.loc[most, "step"],
                "model_slope_s": model_slope,
            }
        )
    return pd.DataFrame(rows)


KINDS = [
    "pp 1, tp in a node",
    "pipelined, some or no stage hops cross nodes",
    "pipelined, every stage hop crosses nodes",
    "tp across nodes",
]


def micro_batch_summary(lines: pd.DataFrame) -> pd.DataFrame:
    """Per kind of layout: families, the median measured and model slope (seconds per
    micro-batch), the median R^2 and slowest/fastest step, and the share of families whose
    steps are stall-bound: a line with R^2 >= 0.95 whose fixed cost is at least half the step
    at the smallest micro-batch."""
    rows = []
    for name in KINDS:
        g = lines[lines["kind"] == name]
        if g.empty:
            continue
        bound = (g["r2"] >= 0.95) & (g["fixed_share"] >= 0.5)
        rows.append(
            {
                "layouts": name,
                "families": len(g),
                "median_s_per_micro_batch": g["slope_s"].median(),
                "model_s_per_micro_batch": g["model_slope_s"].median(),
                "median_r2": g["r2"].median(),
                "median_slowest_over_fastest": g["slowest_over_fastest"].median(),
                "stall_bound_%": 100 * bound.mean(),
            }
        )
    return pd.DataFrame(rows)
