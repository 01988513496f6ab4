"""Leave-one-source-group-out check: refit the time constants without a group, then predict it.

The shipped constants were fitted on a fixed third of every source group's rows, so even the
held-out two thirds of a group come from the stack, cluster and authors the fit has seen. A
source the project does not ship has none of that. Refitting without a whole group and
predicting all of its rows is the nearest this data comes to that test: a GPU family that only
the left-out group measured takes the h100 fit, as `scripts/fit_profiles.py` gives a family
with no published runs.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from autoconfig import catalog
from autoconfig.cost.evaluate import evaluate
from autoconfig.fit import TIME_PARAMS, fit_time, gemm_class, with_params
from autoconfig.frame import TrainingRows
from autoconfig.resolve import read_resolved
from autoconfig.specs import Efficiency
from autoconfig.validation import THROUGHPUT_APART, measured_throughput

FALLBACK_CHIP = "h100"  # what a family without fitted runs takes (scripts/fit_profiles.py)


def fit_time_constants(
    runs: pd.DataFrame, start: dict[str, Efficiency] | None = None
) -> tuple[dict[str, dict[str, float]], float, dict]:
    """The time constants by chip fitted on `runs`' completed rows with a measured throughput,
    each source group weighted once and the groups in THROUGHPUT_APART left out, from `start`
    (the shipped constants when None); with the robust cost and the rows each chip was fitted
    on."""
    fit = runs[runs["status"] == "ok"].reset_index(drop=True)
    measured = measured_throughput(fit)
    start = start or {g.chip: g.efficiency for g in catalog.gpus().values()}
    rows, _ = read_resolved(fit)
    chips = row_chips(rows)
    usable = measured.notna() & ~fit["source_group"].isin(THROUGHPUT_APART)
    sizes = fit.loc[usable, "source_group"].value_counts()
    weights = (1.0 / fit["source_group"].map(sizes)).where(usable, 0.0).to_numpy()
    values = measured.where(usable).to_numpy(float)
    constants, cost = fit_time(rows.inputs(), chips, values, start, weights=weights)
    fitted_rows = measured.notna().to_numpy()
    counts = {c: int((chips[fitted_rows] == c).sum()) for c in constants}
    return constants, cost, counts


def neutral_start() -> dict[str, Efficiency]:
    """Every chip's constants at the middle of their physical ranges (fit.TIME_PARAMS): a
    start that owes nothing to the shipped fit, which saw every group."""
    middle = {name: (lo + hi) / 2 for name, (_, _, lo, hi) in TIME_PARAMS.items()}
    return {g.chip: g.efficiency.model_copy(update=middle) for g in catalog.gpus().values()}


def row_chips(rows: TrainingRows) -> np.ndarray:
    """Each row's GPU family ('' where the row could not be read)."""
    return np.array(
        ["" if e else h.gpu.chip for h, e in zip(rows.hardware, rows.errors, strict=True)]
    )


def complete(constants: dict[str, dict[str, float]], chips: set[str]) -> dict:
    """Constants for every chip in `chips`: a chip without its own takes FALLBACK_CHIP's, and a
    GEMM format no row of the source chip measured takes the next wider format's efficiency
    (fp4 <- fp8 <- 16-bit, as `Efficiency` reads a profile without them), so no constant of
    the shipped profiles (fitted with the left-out rows) is left in place."""
    out = {}
    for chip in chips:
        values = dict(constants.get(chip, constants[FALLBACK_CHIP]))
        values.setdefault("gemm_fp8", values["gemm"])
        values.setdefault("gemm_fp4", values["gemm_fp8"])
        out[chip] = values
    return out


def predict_with(
    runs: pd.DataFrame, constants: dict[str, dict[str, float]]
) -> tuple[pd.Series, np.ndarray]:
    """Predicted tokens/s/GPU of each row of `runs` under `constants` (NaN where refused), and
    each row's GPU family."""
    rows, _ = read_resolved(runs.reset_index(drop=True))
    chips = row_chips(rows)
    x = rows.inputs()
    known = set(chips) - {""}
    x = with_params(x, chips, gemm_class(x, len(chips)), complete(constants, known))
    with np.errstate(all="ignore"):
        tps = np.broadcast_to(evaluate(x)["pred_tokens_per_s_per_gpu"], len(chips))
    return pd.Series(np.where(chips != "", tps, np.nan), index=runs.index), chips


def leave_group_out(runs: pd.DataFrame, groups: list[str]) -> pd.DataFrame:
    """For each group in `groups`: the time constants refitted on the other groups' rows of
    the calibration third (from `neutral_start`), and this group's completed, measured rows
    predicted with them. One row per predicted run: its group, GPU family, whether that family
    was fitted without the group (else it took FALLBACK_CHIP's constants) and the absolute
    percentage error."""
    measured = measured_throughput(runs)
    parts = []
    for group in groups:
        train = runs[runs["fit_set"] & (runs["source_group"] != group)]
        constants, _, _ = fit_time_constants(train, neutral_start())
        test = runs[(runs["source_group"] == group) & (runs["status"] == "ok") & measured.notna()]
        pred, chips = predict_with(test, constants)
        parts.append(
            pd.DataFrame(
                {
                    "source_group": group,
                    "chip": chips,
                    "chip_fitted": [c in constants for c in chips],
                    "ape": (pred / measured[test.index] - 1).abs().to_numpy(),
                }
            )
        )
    return pd.concat(parts, ignore_index=True).dropna(subset=["ape"])


def left_out_table(left_out: pd.DataFrame) -> pd.DataFrame:
    """Per group: rows, median APE and share within +-20% with the group left out of the fit,
    and the GPU families only it measured (which took FALLBACK_CHIP's constants)."""
    table = []
    for group, g in left_out.groupby("source_group", sort=True):
        borrowed = sorted(set(g.loc[~g["chip_fitted"], "chip"]))
        table.append(
            {
                "source_group": group,
                "rows": len(g),
                "left_out_median_ape_%": 100 * g["ape"].median(),
                "left_out_within_20_%": 100 * (g["ape"] <= 0.2).mean(),
                "families_only_it_measured": ", ".join(borrowed) or "-",
            }
        )
    return pd.DataFrame(table)
