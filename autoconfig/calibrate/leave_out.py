"""The shared time constants fitted on published runs, and the leave-one-group-out check.

`fit_time_constants` is the one fit of the time constants: `scripts/fit_profiles.py` ships
what it fits on the calibration third of every source group. The check refits them without a
whole group and predicts all of that group's rows. The shipped constants saw every group, so
even a group's held-out two thirds come from a stack, cluster and authors the fit has seen; a
source the project does not ship has none of that, and this is the nearest this data comes to
that test. The constants left to fit are shared by every GPU (SHARED_CONSTANTS); GEMM,
attention and NVLink collective times come from each GPU's measured kernel tables. A row's
unknown settings are still resolved as the fastest that fits under the shipped constants
(`resolve.read_resolved`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from autoconfig.calibrate.fit import (
    GEMM_CLASSES,
    TIME_PARAMS,
    fit_time,
    gemm_class,
    with_params,
)
from autoconfig.calibrate.validation import THROUGHPUT_APART, error_stats, measured_throughput
from autoconfig.cost.evaluate import evaluate
from autoconfig.cost.inputs import CostInputs
from autoconfig.layout_search import spread
from autoconfig.rows.resolve import read_resolved
from autoconfig.rows.training import TrainingRows
from autoconfig.spec import catalog
from autoconfig.spec.schema import Efficiency

FALLBACK_CHIP = "h100"  # what a family without fitted runs takes (scripts/fit_profiles.py)


# The time constants the measured kernel tables leave to a fit: overheads with units (a
# kernel launch, a collective's latency step, a step's fixed work) and the share of each
# link's bandwidth a collective reaches, one value for every chip (no per-family scale).
# GEMM and attention rates come from each chip's measured kernels (cost.kernel_time); their
# efficiency constants stay only for a chip without tables.
SHARED_CONSTANTS = (
    "memory",
    "kernel_us",
    "intra_node_bus",
    "inter_node_bus",
    "intra_node_latency_us",
    "inter_node_latency_us",
    "step_overhead_ms",
)
KERNEL_CONSTANTS = ("gemm", "gemm_fp8", "gemm_fp4", "attention")
SHARED = "every chip"  # the label the shared fit is made under
# Memory-bound kernels measured on one H100: single-pass copies, casts and adds at 0.69-0.90
# of HBM bandwidth (docs/measured/h100_kernels.json: device copy 3.00 TB/s, bf16 cast 2.72,
# residual add 2.32, of 3.35); the same HBM controllers' share is taken for every chip.
MEASURED_RANGES = {"memory": (0.69, 0.90)}


def fit_time_constants(
    runs: pd.DataFrame, start: dict[str, Efficiency] | None = None
) -> tuple[dict[str, dict[str, float]], float, dict[str, int]]:
    """The time constants by chip fitted on `runs`' completed rows with a measured throughput,
    each source group weighted once and the groups in THROUGHPUT_APART left out, from `start`
    (the shipped constants when None): SHARED_CONSTANTS one value for all chips, inside
    their physical and measured ranges (fit.TIME_PARAMS, MEASURED_RANGES); a chip's kernel
    efficiency constants (used only where it has no measured tables) as `start` has them.
    With the robust cost and the rows each chip has in the fit (those that weigh in it)."""
    fit = runs[runs["status"] == "ok"].reset_index(drop=True)
    measured = measured_throughput(fit)
    if start is None:
        start = {g.chip: g.efficiency for g in catalog.gpus().values()}
    rows, _ = read_resolved(fit)
    chips = row_chips(rows)
    usable = measured.notna() & ~fit["source_group"].isin(THROUGHPUT_APART)
    sizes = fit.loc[usable, "source_group"].value_counts()
    weights = (1.0 / fit["source_group"].map(sizes)).where(usable, 0.0).to_numpy()
    values = measured.where(usable).to_numpy(float)
    constants, cost = fit_time(
        rows.inputs(),
        np.where(chips != "", SHARED, ""),
        values,
        {SHARED: start[FALLBACK_CHIP]},
        only=SHARED_CONSTANTS,
        bounds=MEASURED_RANGES,
        weights=weights,
    )
    shared = constants.get(SHARED, {})
    fitted_chips = sorted(set(chips[usable.to_numpy()]) - {""})
    out = {chip: {**_kernel_constants(start[chip]), **shared} for chip in fitted_chips}
    counts = {c: int((chips[usable.to_numpy()] == c).sum()) for c in out}
    return out, cost, counts


def _kernel_constants(efficiency: Efficiency) -> dict[str, float]:
    """A chip's GEMM and attention efficiency constants that it states (its fallback where it
    has no measured kernel tables)."""
    stated = {name: getattr(efficiency, name) for name in KERNEL_CONSTANTS}
    return {name: value for name, value in stated.items() if value is not None}


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


def constants_for_chips(
    constants: dict[str, dict[str, float]], chips: set[str]
) -> dict[str, dict[str, float]]:
    """Every time constant for every chip in `chips`, so that none of the shipped profiles'
    (fitted with the left-out rows) stays in place: a chip without its own takes
    FALLBACK_CHIP's; a GEMM format no row of the chip measured takes the next wider format's
    efficiency (fp4 <- fp8 <- 16-bit, as `Efficiency` reads a profile without them), and a
    chip with no 16-bit rows FALLBACK_CHIP's 16-bit one. A refit that left a non-GEMM
    constant out is refused."""
    if "gemm" not in constants.get(FALLBACK_CHIP, {}):
        raise ValueError(f"no {FALLBACK_CHIP} constants to fall back on: {sorted(constants)}")
    out = {}
    for chip in chips:
        values = dict(constants.get(chip, constants[FALLBACK_CHIP]))
        missing = set(TIME_PARAMS) - set(values) - set(GEMM_CLASSES)
        if missing:
            raise ValueError(f"{chip}: the refit lacks {sorted(missing)}")
        values.setdefault("gemm", constants[FALLBACK_CHIP]["gemm"])
        values.setdefault("gemm_fp8", values["gemm"])
        values.setdefault("gemm_fp4", values["gemm_fp8"])
        out[chip] = values
    return out


def predict_with(
    runs: pd.DataFrame, constants: dict[str, dict[str, float]]
) -> tuple[pd.Series, np.ndarray]:
    """Predicted tokens/s/GPU of each row of `runs` under `constants` (NaN where refused), and
    each row's GPU family."""
    pred, chips, _, _ = _predicted(runs, constants)
    return pred, chips


def _predicted(
    runs: pd.DataFrame, constants: dict[str, dict[str, float]]
) -> tuple[pd.Series, np.ndarray, CostInputs, dict[str, np.ndarray]]:
    """`predict_with`'s figures, with the rows' cost inputs and every prediction column."""
    rows, _ = read_resolved(runs.reset_index(drop=True))
    chips = row_chips(rows)
    x = rows.inputs()
    known = set(chips) - {""}
    x = with_params(x, chips, gemm_class(x, len(chips)), constants_for_chips(constants, known))
    with np.errstate(all="ignore"):
        out = evaluate(x)
    tps = np.broadcast_to(out["pred_tokens_per_s_per_gpu"], len(chips))
    return pd.Series(np.where(chips != "", tps, np.nan), index=runs.index), chips, x, out


def leave_group_out(runs: pd.DataFrame, groups: list[str]) -> pd.DataFrame:
    """For each group in `groups`: the time constants refitted on the other groups' rows of
    the calibration third (from `neutral_start`), and this group's completed, measured rows
    predicted with them. One row per measured run: its group, GPU family, whether some other
    group's calibration rows fitted that family (else it took FALLBACK_CHIP's constants), the
    absolute percentage error and the signed `log_ratio` log(pred/measured) (NaN where the
    model refuses the row); and what places the row in an error regime (training.spread): its
    resolved tp, cp, pp, dp, zero, GPUs per node, predicted peak memory and capacity (memory
    needs no time constant, so the refit gives it), with one boolean per regime."""
    measured = measured_throughput(runs)
    parts = []
    for group in groups:
        train = runs[runs["fit_set"] & (runs["source_group"] != group)]
        constants, _, _ = fit_time_constants(train, neutral_start())
        test = runs[(runs["source_group"] == group) & (runs["status"] == "ok") & measured.notna()]
        pred, chips, x, out = _predicted(test, constants)
        ratio = (pred / measured[test.index]).to_numpy(float)
        with np.errstate(all="ignore"):
            log_ratio = np.log(ratio)
        parts.append(
            pd.concat(
                [
                    pd.DataFrame(
                        {
                            "source_group": group,
                            "chip": chips,
                            "chip_fitted": [c in constants for c in chips],
                            "ape": np.abs(ratio - 1),
                            "log_ratio": log_ratio,
                        }
                    ),
                    _regime_columns(x, out, len(test)),
                ],
                axis=1,
            )
        )
    return pd.concat(parts, ignore_index=True)


def _regime_columns(x: CostInputs, out: dict[str, np.ndarray], n: int) -> pd.DataFrame:
    """The layout and memory columns spread.regimes reads, for `n` rows as resolved and
    predicted (memory needs no time constant, so the refit's predictions give it), and the
    regime flags themselves."""
    cols = {
        name: np.broadcast_to(np.asarray(getattr(x, name), float), n)
        for name in ("tp", "cp", "pp", "dp", "zero", "gpus_per_node")
    }
    for name in ("pred_peak_mem_gib", "mem_capacity_gib"):
        cols[name] = np.broadcast_to(np.asarray(out[name], float), n)
    frame = pd.DataFrame(cols)
    return pd.concat([frame, spread.regimes(frame, frame["gpus_per_node"])], axis=1)


def left_out_table(left_out: pd.DataFrame) -> pd.DataFrame:
    """Per group: measured rows, the share predicted, median APE and share within +-20% with
    the group left out of the fit, and the GPU families no other group's calibration rows
    measured (which took FALLBACK_CHIP's constants)."""
    table = []
    for group, g in left_out.groupby("source_group", sort=True):
        stats = error_stats(g["ape"])  # over the rows predicted
        predicted = g[g["ape"].notna()]
        borrowed = sorted(set(predicted.loc[~predicted["chip_fitted"], "chip"]))
        table.append(
            {
                "source_group": group,
                "rows": len(g),
                "predicted_%": 100 * stats["rows"] / len(g),
                "left_out_median_ape_%": stats["median_ape_%"],
                "left_out_within_20_%": stats["within_20%"],
                f"families_from_{FALLBACK_CHIP}_fit": ", ".join(borrowed) or "-",
            }
        )
    return pd.DataFrame(table)
