"""Fits a GPU family's efficiency constants to measured runs (robust least squares).

The constants are few and physical (GEMM/attention/memory efficiency, kernel and step costs,
collective bus efficiency and latency), shared by every GPU of one chip family, so a fit on
some runs can be checked on others. Throughput residuals are log(predicted/measured) with a
Cauchy loss, so broken measurements (a few published runs are 10-50x off their neighbours)
cannot drag the constants.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from autoconfig.cost.evaluate import evaluate
from autoconfig.cost.inputs import CostInputs
from autoconfig.cost.memory import memory
from autoconfig.spec.schema import Efficiency, GPUSpec
from autoconfig.spec.vocab import GIB

# Efficiency field -> (CostInputs column, scale from profile units, lower, upper bound). The
# bounds are physical, so that a constant cannot absorb what the model misses elsewhere:
# cuBLAS reaches 60-85% of dense peak on large bf16/fp8 GEMMs (NVIDIA's published GEMM
# benchmarks), FlashAttention-2/3 15-75% (Dao 2023; Shah et al. 2024), STREAM-like copies
# 50-95% of HBM bandwidth, NCCL 50-95% of NVLink and 30-95% of the NIC's line rate
# (nccl-tests bus bandwidth), a kernel launch 1-20 us without CUDA graphs, a collective's
# fixed latency 1-60 us, and a step's own fixed work (optimizer launch, logging, data)
# at most 50 ms.
TIME_PARAMS = {
    "gemm": ("eff_gemm", 1.0, 0.4, 0.85),
    "gemm_fp8": ("eff_gemm", 1.0, 0.3, 0.85),
    "gemm_fp4": ("eff_gemm", 1.0, 0.2, 0.85),
    "attention": ("eff_attention", 1.0, 0.15, 0.85),
    "memory": ("eff_memory", 1.0, 0.5, 0.95),
    "kernel_us": ("kernel_s", 1e-6, 1.0, 20.0),
    "intra_node_bus": ("eff_intra", 1.0, 0.5, 0.95),
    "inter_node_bus": ("eff_inter", 1.0, 0.3, 0.95),
    "intra_node_latency_us": ("lat_intra_s", 1e-6, 1.0, 60.0),
    "inter_node_latency_us": ("lat_inter_s", 1e-6, 1.0, 60.0),
    "step_overhead_ms": ("step_overhead_s", 1e-3, 0.0, 50.0),
}


GEMM_CLASSES = {"gemm": 16, "gemm_fp8": 8, "gemm_fp4": 4}


def measured_bounds(gpus: Iterable[GPUSpec]) -> dict[str, dict[str, tuple[float, float]]]:
    """By chip, the ranges its profiles state as measured on its kernels
    (`GPUSpec.measured_efficiency`, which names fitted fraction constants only): where several
    profiles of one chip state a constant, the range all of them allow."""
    out: dict[str, dict[str, tuple[float, float]]] = {}
    for gpu in gpus:
        for name, measured in gpu.measured_efficiency.items():
            lo, hi = out.setdefault(gpu.chip, {}).get(name, (0.0, np.inf))
            lo, hi = max(lo, measured.low), min(hi, measured.high)
            if lo > hi:
                raise ValueError(
                    f"{gpu.name}: measured_efficiency.{name} leaves no range its chip "
                    f"{gpu.chip}'s other profiles allow"
                )
            out[gpu.chip][name] = (lo, hi)
    return out


def gemm_class(x: CostInputs, n: int) -> np.ndarray:
    """Each row's GEMM format class: 16-bit, 8-bit (fp8, mxfp8) or 4-bit (nvfp4)."""
    b = np.broadcast_to(x.gemm_bytes, (n,))
    return np.where(b >= 2.0, 16, np.where(b >= 1.0, 8, 4))


def with_params(
    x: CostInputs, chips: np.ndarray, classes: np.ndarray, values: dict[str, dict[str, float]]
) -> CostInputs:
    """`x` with the constants of each chip's rows replaced (GEMM efficiency by format)."""
    cols: dict[str, np.ndarray] = {}
    for chip, params in values.items():
        rows = chips == chip
        for name, value in params.items():
            col, scale, _, _ = TIME_PARAMS[name]
            rows_here = rows & (classes == GEMM_CLASSES[name]) if name in GEMM_CLASSES else rows
            arr = cols.setdefault(col, np.array(np.broadcast_to(getattr(x, col), chips.shape)))
            arr[rows_here] = value * scale
    return replace(x, **cols)


def fit_time(
    x: CostInputs,
    chips: np.ndarray,
    measured: np.ndarray,
    start: dict[str, Efficiency],
    only: tuple[str, ...] | None = None,
    bounds: dict[str, tuple[float, float]] | None = None,
    weights: np.ndarray | None = None,
    prior_weight: float = 0.0,
    f_scale: float = 0.15,
    chip_bounds: dict[str, dict[str, tuple[float, float]]] | None = None,
) -> tuple[dict[str, dict[str, float]], float]:
    """Fits TIME_PARAMS per chip (the `chips` entry of each row of `x`) on rows with a measured
    tokens/s/GPU (NaN elsewhere); returns the constants by chip and the robust cost. `only`
    limits the fit to some constants (few measurements cannot pin all ten); `bounds` widens or
    narrows their ranges; `weights` weigh the rows (e.g. so each source group counts once).
    `prior_weight` > 0 adds one residual per constant, `prior_weight` x its log-distance from
    its `start` value (`prior_distance`), so that a constant moves only as far as the
    measurements pull it; those residuals are squared as they are (no robust loss). `f_scale`
    is the log error beyond which a measurement counts as an outlier (Cauchy loss).
    `chip_bounds` narrows one chip's constants further, to ranges measured on its own kernels
    (`measured_bounds`)."""
    bounds = bounds or {}
    chip_bounds = chip_bounds or {}
    measured = np.asarray(measured, float)
    use = np.isfinite(measured) & (chips != "")
    classes = gemm_class(x, len(chips))
    names: list[tuple[str, str]] = []
    for chip in sorted(set(chips[use])):
        present = set(classes[use & (chips == chip)])
        for name in TIME_PARAMS:
            needed = name not in GEMM_CLASSES or GEMM_CLASSES[name] in present
            if needed and (only is None or name in only):
                names.append((chip, name))
    x0 = np.array([getattr(start[c], n) or start[c].gemm_fp8 or start[c].gemm for c, n in names])
    general = [bounds.get(n, TIME_PARAMS[n][2:]) for _, n in names]
    measured_here = [chip_bounds.get(c, {}).get(n, (0.0, np.inf)) for c, n in names]
    lo = np.array([max(g[0], m[0]) for g, m in zip(general, measured_here, strict=True)], float)
    hi = np.array([min(g[1], m[1]) for g, m in zip(general, measured_here, strict=True)], float)
    target = np.log(measured[use])
    root_w = np.sqrt(np.ones(len(chips)) if weights is None else np.asarray(weights, float))[use]

    def unpack(theta: np.ndarray) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for (chip, name), value in zip(names, theta, strict=True):
            out.setdefault(chip, {})[name] = float(value)
        return out

    x0 = np.clip(x0, lo, hi)
    eps = prior_offset(x0, hi)
    n_data = int(use.sum())

    def residuals(theta: np.ndarray) -> np.ndarray:
        xi = with_params(x, chips, classes, unpack(theta))
        with np.errstate(all="ignore"):
            tps = evaluate(xi)["pred_tokens_per_s_per_gpu"][use]
        fit = root_w * (np.log(np.maximum(tps, 1e-9)) - target)
        if prior_weight <= 0:
            return fit
        return np.concatenate([fit, prior_weight * prior_distance(theta, x0, eps)])

    def loss(z: np.ndarray) -> np.ndarray:
        """Cauchy on the measurements' residuals, plain squares on the prior's."""
        rho = np.empty((3, z.size))
        d = z[:n_data]
        rho[0, :n_data], rho[1, :n_data], rho[2, :n_data] = (
            np.log1p(d),
            1 / (1 + d),
            -1 / (1 + d) ** 2,
        )
        rho[0, n_data:], rho[1, n_data:], rho[2, n_data:] = z[n_data:], 1.0, 0.0
        return rho

    result = least_squares(
        residuals,
        x0,
        bounds=(lo, hi),
        loss=loss if prior_weight > 0 else "cauchy",
        f_scale=f_scale,
        x_scale="jac",
        max_nfev=400,
        diff_step=1e-3,  # the cost inputs are float32: smaller steps vanish in rounding
    )
    return unpack(result.x), float(result.cost)


def prior_offset(prior: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """The offset of each constant's log-distance: 0 for fractions (efficiencies, bounded by
    1), half the prior for costs that can reach 0 (latencies, overheads: halving one costs as
    much as a factor 1.5 the other way), 1% of the bound for a prior of 0."""
    prior, hi = np.asarray(prior, float), np.asarray(hi, float)
    return np.where(hi <= 1.0, 0.0, np.where(prior > 0, 0.5 * prior, 0.01 * hi))


def prior_distance(theta: np.ndarray, prior: np.ndarray, eps: np.ndarray) -> np.ndarray:
    """Each constant's log-distance from its prior (offset by `eps`, so 0 stays finite)."""
    return np.log(np.asarray(theta) + eps) - np.log(np.asarray(prior) + eps)


def fit_memory(
    x: CostInputs, valid: np.ndarray, runs: pd.DataFrame, measured_gib: pd.Series
) -> tuple[float, float]:
    """Fits (memory_overhead fraction, memory_reserved_gib) so that
    peak = parts * (1 + overhead) + reserved agrees with all the memory evidence:

    - measured peaks (relative error; each source group weighs the same, since allocators
      differ: the nanotron sweep peaks ~1.5x above its live tensors),
    - runs that completed (status ok) had to fit: a hinge on predicted/capacity above 1,
    - runs that crashed or ran out of memory probably did not fit: a weaker hinge the other
      way (the sweep does not tell crashes from OOMs).
    """
    with np.errstate(all="ignore"):
        mem = memory(replace(x, mem_overhead=np.float32(0.0), mem_reserved_gib=np.float32(0.0)))
    base = np.broadcast_to(mem.total / GIB, valid.shape).astype(float)
    capacity = np.broadcast_to(x.memory_gib, valid.shape).astype(float)
    has_peak = valid & measured_gib.notna().to_numpy()
    meas = measured_gib.to_numpy()[has_peak]
    groups = runs.loc[has_peak, "source_group"]
    peak_w = np.sqrt(1.0 / groups.map(groups.value_counts()).to_numpy(dtype=float))
    status = runs["status"].to_numpy()
    ok = valid & (status == "ok")
    failed = valid & (status != "ok")
    # "Completed runs fit" is the firmest evidence: a measured peak near capacity overstates the
    # need (the caching allocator keeps freed blocks until memory runs short), a completed run
    # cannot have needed more than the GPU had. Its hinge weighs 10x a source group of peaks.
    ok_w = 10.0 * np.sqrt(groups.nunique() / max(ok.sum(), 1))
    failed_w = np.sqrt(1.0 / max(failed.sum(), 1))

    def residuals(theta: np.ndarray) -> np.ndarray:
        pred = base * (1 + theta[0]) + theta[1]
        return np.concatenate(
            [
                peak_w * (pred[has_peak] / meas - 1.0),
                ok_w * np.maximum(pred[ok] / capacity[ok] - 1.0, 0.0),
                failed_w * np.maximum(1.0 - pred[failed] / capacity[failed], 0.0),
            ]
        )

    result = least_squares(
        residuals, [0.1, 1.0], bounds=([0.0, 0.0], [1.0, 10.0]), loss="soft_l1", f_scale=0.1
    )
    return float(result.x[0]), float(result.x[1])
