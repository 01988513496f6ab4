"""Which measured kernel tables time each GPU: the codes of CostInputs.kernel_chip and the
table set they index.

A GPU profile names its tables (`GPUSpec.kernel_table`, a folder of profiles/kernels/). A
table's rates become efficiencies against the datasheet peaks of the GPU it was measured on
(the profile naming it without a stand-in note), so a GPU timed by another's tables (a
stand-in) runs at those efficiencies times its own peaks; such a GPU is named once on stderr
with the reason its profile gives. A stand-in GPU with measured GEMM rates of its own
(`GPUSpec.gemm_rates`) gets its own code: the stand-in's tables, each GEMM format's efficiency
times that GPU's measured ratio (columns.gemm_rates), attention's times the bf16 one where
measured (no attention kernel of these GPUs was).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from functools import cache, lru_cache
from typing import overload

from autoconfig.columns.gemm_rates import describe, gemm_ratios
from autoconfig.columns.kernel_catalog import kernel_chips, kernel_tables
from autoconfig.cost.kernel_tables import KernelTables
from autoconfig.cost.kernel_time import KernelSet
from autoconfig.spec import catalog
from autoconfig.spec.schema import GPUSpec

# The profile precision whose peak each table format is measured against.
FORMAT_PEAK = {"bf16": "bf16", "fp8": "fp8", "fp8_block": "fp8", "nvfp4": "nvfp4"}

_told: set[str] = set()


class _LazyTables(Sequence[KernelTables]):
    """The tables by code, each read from its package files the first time a row needs it
    (a search on one GPU reads one chip's, not eight)."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self._names = names  # a table's folder, or folder@gpu for a GPU's rated copy

    def __len__(self) -> int:
        return len(self._names)

    @overload
    def __getitem__(self, code: int) -> KernelTables: ...
    @overload
    def __getitem__(self, code: slice) -> Sequence[KernelTables]: ...
    def __getitem__(self, code: int | slice) -> KernelTables | Sequence[KernelTables]:
        if isinstance(code, slice):
            return [self[i] for i in range(len(self))[code]]
        table = kernel_tables(self._names[code].split("@")[0])
        if table is None:  # the folder was listed as shipped a moment ago
            raise FileNotFoundError(f"kernel tables '{self._names[code]}' are missing")
        return table


def _measured_peaks(table: str) -> dict[str, float]:
    """Dense peaks by table format (and attention's, the 16-bit one) of the GPU `table` was
    measured on: the profile naming it without a stand-in note."""
    gpus = catalog.gpus().values()
    native = [g for g in gpus if g.kernel_table == table and not g.kernel_table_stand_in]
    owner = native[0] if native else next(g for g in gpus if g.kernel_table == table)
    peak = owner.peak_tflops
    peaks = {fmt: peak.get(p) or peak.get("fp8") or peak["bf16"] for fmt, p in FORMAT_PEAK.items()}
    return {**peaks, "attention": peak["bf16"]}


def stand_in_peaks(gpu: GPUSpec) -> dict[str, float]:
    """The dense peaks, by table format, of the chip `gpu`'s tables were measured on."""
    return _measured_peaks(gpu.kernel_table)


def _rated_name(gpu: GPUSpec) -> str:
    return f"{gpu.kernel_table}@{gpu.name}"


def _peaks(name: str) -> dict[str, float]:
    """The peaks an efficiency divides a table's rate by: those of the chip a table was
    measured on; for a rated stand-in GPU's copy (folder@gpu), those divided by its measured
    ratios (an efficiency is rate / peak)."""
    table, _, rated_gpu = name.partition("@")
    base = _measured_peaks(table)
    if not rated_gpu:
        return base
    ratios = gemm_ratios(catalog.get_gpu(rated_gpu), base)
    rated = {f: base[f] / r.ratio for f, r in ratios.items()}
    # Flash attention is 16-bit matrix-core work as a bf16 GEMM is: with no attention kernel
    # of the GPU measured, it takes the bf16 GEMMs' ratio where one was measured.
    if "bf16" in ratios:
        rated["attention"] = base["attention"] / ratios["bf16"].ratio
    return {**base, **rated}


class _LazyPeaks(Sequence[dict[str, float]]):
    """The peaks by code, each worked out the first time a row needs it: a rated copy's read
    the stand-in's tables and the measured GEMM times, which a search on another GPU skips."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self._names = names

    def __len__(self) -> int:
        return len(self._names)

    @overload
    def __getitem__(self, code: int) -> dict[str, float]: ...
    @overload
    def __getitem__(self, code: slice) -> Sequence[dict[str, float]]: ...
    def __getitem__(self, code: int | slice) -> dict[str, float] | Sequence[dict[str, float]]:
        if isinstance(code, slice):
            return [self[i] for i in range(len(self))[code]]
        return _cached_peaks(self._names[code])


@cache
def _cached_peaks(name: str) -> dict[str, float]:
    return _peaks(name)


@lru_cache(maxsize=1)
def _tables() -> tuple[tuple[str, ...], KernelSet]:
    """The tables some GPU profile names and the package ships, in name order; then each
    rated stand-in GPU's copy (folder@gpu), with their peaks (_peaks)."""
    gpus = catalog.gpus().values()
    shipped = set(kernel_chips())
    names = sorted({g.kernel_table for g in gpus if g.kernel_table} & shipped)
    names += sorted(_rated_name(g) for g in gpus if g.gemm_rates and g.kernel_table in shipped)
    return tuple(names), KernelSet(_LazyTables(tuple(names)), _LazyPeaks(tuple(names)))


def kernel_set() -> KernelSet:
    """Every shipped table, in the order `table_code` numbers them."""
    return _tables()[1]


def table_code(gpu: GPUSpec) -> int:
    """The index of `gpu`'s tables in `kernel_set()`, -1 where it has none (its efficiency
    constants time its GEMMs and attention)."""
    names = _tables()[0]
    if gpu.kernel_table not in names:
        return -1
    rated = gpu.gemm_rates and _rated_name(gpu) in names
    if gpu.kernel_table_stand_in and gpu.name not in _told:
        _told.add(gpu.name)
        note = f"{gpu.name}: timed by {gpu.kernel_table_stand_in}"
        if rated:
            ratios = gemm_ratios(gpu, _measured_peaks(gpu.kernel_table))
            note += f"; its GEMMs at its measured efficiency over the tables': {describe(ratios)}"
        print(note, file=sys.stderr)
    return names.index(_rated_name(gpu) if rated else gpu.kernel_table)
