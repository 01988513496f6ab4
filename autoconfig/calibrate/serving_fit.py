"""Fits the serving constants that stay fitted (profiles/gpus/*.yaml `inference:`) to published
serving points: scripts/fit_inference.py writes them per chip, scripts/validate_inference.py
refits them without each GPU family to predict it left out.

Where the measured kernel tables time a row's GEMMs, all-reduces and smallest kernels
(cost/serving_gemm.py, cost/kernel_time.py), what is left to fit is the share of HBM bandwidth
the memory-bound work (K/V reads, norms, activations) streams at and the engine's host work per
iteration: a fixed part and a part per running sequence (in-flight rows; a static batch's
steps take the fixed part alone). Rows the tables cannot time (weight-only formats, fp32, chips
without tables) fit every constant, as before the tables.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from autoconfig.cost.inference import ServeInputs, evaluate_serving
from autoconfig.cost.max_load import evaluate_max_load
from autoconfig.cost.serving_gemm import applies
from autoconfig.rows.serving import read_serving_rows

# name: (start, lower, upper, scale to the ServeInputs column)
PARAMS = {
    "memory": (0.75, 0.3, 1.0, 1.0),
    "gemm": (0.65, 0.2, 1.0, 1.0),
    "kernel_us": (4.0, 0.0, 50.0, 1e-6),
    "allreduce_base_us": (15.0, 0.0, 200.0, 1e-6),
    "allreduce_step_us": (10.0, 0.0, 200.0, 1e-6),
    # Host work per engine iteration (scheduler, input preparation, sampling): none to 5 ms.
    "iteration_us": (100.0, 0.0, 5000.0, 1e-6),
    # ... and per running sequence (its scheduling, sampling, output bookkeeping): 0-50 us.
    "sequence_us": (1.0, 0.0, 50.0, 1e-6),
}
COLUMN = {
    "memory": "eff_memory",
    "gemm": "eff_gemm",
    "kernel_us": "kernel_s",
    "allreduce_base_us": "ar_base_s",
    "allreduce_step_us": "ar_step_s",
    "iteration_us": "iteration_s",
    "sequence_us": "sequence_s",
}
# What stays fitted where the measured kernel tables time a chip's GEMMs, all-reduces and
# smallest kernels (serving_gemm, kernel_time): the share of HBM bandwidth the memory-bound
# work streams at and the host's work per step, with a part per running sequence for in-flight
# batching (a static batch's sequences all run every step: the two are not told apart).
MEASURED_CONTINUOUS = ("memory", "iteration_us", "sequence_us")
MEASURED_STATIC = ("memory", "iteration_us")


def fitted_names(inputs: ServeInputs, continuous: np.ndarray) -> tuple[str, ...]:
    """The constants the rows can tell: with every row's GEMMs timed by measured tables, only
    MEASURED_CONTINUOUS (in-flight rows) or MEASURED_STATIC (static ones); else all."""
    timed = applies(inputs.x, inputs.weight_bytes, inputs.act_bytes)
    if not np.all(timed):
        return tuple(PARAMS)
    if np.all(continuous):
        return MEASURED_CONTINUOUS
    return MEASURED_STATIC if not np.any(continuous) else tuple(PARAMS)


def fit(
    runs: pd.DataFrame, current: dict[str, float], names: tuple[str, ...] | None = None
) -> tuple[dict[str, float], float]:
    """The constants of PARAMS that `runs` can tell (fitted_names; or `names`), the others kept
    at `current` (the chip's profile now); and the fit's robust cost."""
    rows = read_serving_rows(runs)
    inputs, errors = rows.inputs(), rows.errors
    if (errors != "").any():
        raise ValueError(f"fit rows with errors: {errors[errors != ''].tolist()}")
    continuous = rows.continuous
    num = lambda c: pd.to_numeric(runs[c], errors="coerce").to_numpy()  # noqa: E731
    measured = np.where(
        continuous, num("measured_output_tokens_per_s_per_gpu"), num("measured_latency_ms")
    )

    names = names or fitted_names(inputs, continuous)
    kept = {n: float(current.get(n, PARAMS[n][0])) for n in PARAMS if n not in names}

    def residuals(theta: np.ndarray) -> np.ndarray:
        values = kept | dict(zip(names, theta, strict=True))
        cols: dict[str, Any] = {COLUMN[n]: v * PARAMS[n][3] for n, v in values.items()}
        s = dataclasses.replace(inputs, **cols)
        with np.errstate(all="ignore"):
            latency = evaluate_serving(s)["pred_latency_ms"]
            tokens = evaluate_max_load(s)["pred_output_tokens_per_s_per_gpu"]
        return np.log(np.where(continuous, tokens, latency) / measured)

    start = np.array([PARAMS[n][0] for n in names])
    lower = np.array([PARAMS[n][1] for n in names])
    upper = np.array([PARAMS[n][2] for n in names])
    result = least_squares(
        residuals, start, bounds=(lower, upper), loss="soft_l1", f_scale=0.1, diff_step=1e-3
    )
    fitted = dict(zip(names, result.x.tolist(), strict=True))
    return {n: fitted.get(n, kept.get(n, 0.0)) for n in PARAMS}, float(result.cost)


def predict(runs: pd.DataFrame, constants: dict[str, float]) -> np.ndarray:
    """Each row's prediction (max-load output tokens/s per GPU for in-flight rows, latency in
    ms for static ones) with `constants` in place of its profile's."""
    rows = read_serving_rows(runs)
    cols: dict[str, Any] = {COLUMN[n]: v * PARAMS[n][3] for n, v in constants.items()}
    s = dataclasses.replace(rows.inputs(), **cols)
    with np.errstate(all="ignore"):
        latency = evaluate_serving(s)["pred_latency_ms"]
        tokens = evaluate_max_load(s)["pred_output_tokens_per_s_per_gpu"]
    return np.where(rows.continuous, tokens, latency)
