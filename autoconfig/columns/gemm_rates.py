"""Measured GEMM rates of a GPU whose kernel tables are another chip's (the AMD Instinct parts,
timed by NVIDIA tables): by table format, how its measured GEMM efficiency compares with the
stand-in table's at the same shapes.

A profile names the rates (`GPUSpec.gemm_rates`, a folder of profiles/gemm_rates/ holding
gemm.csv and provenance.yaml, distilled by scripts/distill_amd_gemm.py) and its compute-unit
count (`sms`) picks its rows. For each measured shape the fastest measured kernel counts (a
tuned library picks it); its efficiency (2 x batch x m x n x k / time, over this GPU's dense
peak of the format) divided by the stand-in table's efficiency for `batch` GEMMs of (m, n, k)
one after another is that shape's ratio, and the median over shapes is the format's. The
stand-in's GEMM efficiencies times that ratio then time this GPU's training GEMMs; formats it
did not measure, and serving steps' few-row GEMMs, keep the stand-in's.
No attention kernel of these GPUs was measured: attention takes the bf16 GEMMs' ratio where
one was measured, the stand-in's efficiency where not (kernel_index).
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from functools import cache
from importlib.resources import files

import numpy as np
import pandas as pd

from autoconfig.base.errors import UserError
from autoconfig.columns.kernel_catalog import kernel_tables
from autoconfig.cost.kernel_tables import gemm_seconds
from autoconfig.spec.schema import GPUSpec

RATES_FOLDER = "gemm_rates"
# The profile precision whose dense peak each table format's efficiency is taken against.
FORMAT_PEAK = {"bf16": "bf16", "fp8": "fp8", "fp8_block": "fp8", "nvfp4": "nvfp4"}


def format_peaks(gpu: GPUSpec) -> dict[str, float]:
    """`gpu`'s dense peak TFLOP/s by table format, a format it lists no peak for taking its
    fp8 peak, else its bf16 one."""
    peak = gpu.peak_tflops
    return {f: peak.get(p) or peak.get("fp8") or peak["bf16"] for f, p in FORMAT_PEAK.items()}


@dataclass(frozen=True)
class RateRatio:
    """One format's measured efficiency over the stand-in table's, median over shapes."""

    ratio: float
    shapes: int
    low: float  # the least and greatest shape's ratio
    high: float


@cache
def measured_gemm(folder: str) -> pd.DataFrame:
    """The rows of profiles/gemm_rates/<folder>/gemm.csv; one line naming the folder where it
    is missing."""
    path = files("autoconfig") / "profiles" / RATES_FOLDER / folder / "gemm.csv"
    if not folder or not path.is_file():
        shipped = files("autoconfig") / "profiles" / RATES_FOLDER
        names = sorted(p.name for p in shipped.iterdir() if (p / "gemm.csv").is_file())
        raise UserError(
            f"gpu: gemm_rates: no measured GEMM rates named {folder!r} ship "
            f"(shipped: {', '.join(names) or 'none'})"
        )
    return pd.read_csv(io.BytesIO(path.read_bytes()))


def gemm_ratios(gpu: GPUSpec, stand_in_peaks: dict[str, float]) -> dict[str, RateRatio]:
    """By table format, `gpu`'s measured GEMM efficiency over its stand-in table's at the same
    shapes (`stand_in_peaks`: the dense peaks, by format, of the chip the table measured);
    empty where the profile names no rates."""
    if not gpu.gemm_rates:
        return {}
    own = tuple(sorted(format_peaks(gpu).items()))
    theirs = tuple(sorted(stand_in_peaks.items()))
    return dict(_ratios(gpu.gemm_rates, gpu.kernel_table, gpu.sms, own, theirs))


@cache
def _ratios(
    folder: str,
    table_name: str,
    compute_units: int,
    own_peaks: tuple[tuple[str, float], ...],
    stand_in_peaks: tuple[tuple[str, float], ...],
) -> tuple[tuple[str, RateRatio], ...]:
    rows = measured_gemm(folder)
    rows = rows[rows["cu_num"] == compute_units]
    if rows.empty:
        measured = sorted(measured_gemm(folder)["cu_num"].unique())
        raise UserError(
            f"gpu: gemm_rates: {folder!r} measured no GPU of {compute_units} compute units "
            f"(sms; measured: {', '.join(str(c) for c in measured)})"
        )
    table = kernel_tables(table_name)
    if table is None:
        raise UserError(f"gpu: gemm_rates: the stand-in tables {table_name!r} do not ship")
    own, theirs = dict(own_peaks), dict(stand_in_peaks)
    out = []
    for fmt, group in rows.groupby("format", sort=True):
        if fmt not in table.gemm:
            continue
        # The fastest measured kernel of each shape: a tuned library calls it.
        shapes = group.sort_values("us").drop_duplicates(["batch", "m", "n", "k"])
        m, n, k = (shapes[c].to_numpy(np.float64) for c in ("m", "n", "k"))
        batch = shapes["batch"].to_numpy(np.float64)
        flops = 2.0 * batch * m * n * k
        measured = flops / (shapes["us"].to_numpy(np.float64) * 1e-6) / own[str(fmt)]
        # a batched call as its GEMMs one after another on the stand-in (each within the
        # table's measured sizes, as a training step's GEMMs are)
        stand_in = flops / (batch * gemm_seconds(table, str(fmt), m, n, k)) / theirs[str(fmt)]
        ratio = measured / stand_in
        out.append(
            (
                str(fmt),
                RateRatio(
                    float(np.median(ratio)), len(ratio), float(ratio.min()), float(ratio.max())
                ),
            )
        )
    return tuple(out)


def describe(ratios: dict[str, RateRatio]) -> str:
    """One clause for the stand-in note: each format's ratio with its shape count and range."""
    return ", ".join(
        f"{fmt} {r.ratio:.2f}x ({r.shapes} shapes, {r.low:.2f}-{r.high:.2f})"
        for fmt, r in ratios.items()
    )
