"""Which measured kernel tables time each GPU: the codes of CostInputs.kernel_chip and the
table set they index.

A GPU profile names its tables (`GPUSpec.kernel_table`, a folder of profiles/kernels/). A
table's rates become efficiencies against the datasheet peaks of the GPU it was measured on
(the profile naming it without a stand-in note), so a GPU timed by another's tables (a
stand-in) runs at those efficiencies times its own peaks; such a GPU is named once on stderr
with the reason its profile gives. A stand-in GPU with measured GEMM rates of its own
(`GPUSpec.gemm_rates`) gets its own code: the stand-in's tables, each training GEMM format's
efficiency times that GPU's measured ratio (columns.gemm_rates), training attention's times the
bf16 one where measured (no attention kernel of these GPUs was); serving keeps the stand-in's.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from functools import cache, lru_cache
from typing import overload

from autoconfig.columns.gemm_rates import describe, format_peaks, gemm_ratios
from autoconfig.columns.kernel_catalog import kernel_chips, kernel_tables
from autoconfig.cost.kernel_tables import KernelTables
from autoconfig.cost.kernel_time import KernelSet
from autoconfig.spec import catalog
from autoconfig.spec.schema import GPUSpec

_told: set[str] = set()


class _LazyTables(Sequence[KernelTables]):
    """The tables by code, each read from its package files the first time a row needs it
    (a search on one GPU reads one chip's, not eight)."""

    def __init__(self, names: list[str]) -> None:
        # a table's folder, or a rated GPU's copy of it (folder@...); shared with _tables,
        # which appends a rated copy the first time a GPU needs one
        self._names = names

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
    return {**format_peaks(owner), "attention": owner.peak("bf16")}


def stand_in_peaks(gpu: GPUSpec) -> dict[str, float]:
    """The dense peaks, by table format, of the chip `gpu`'s tables were measured on."""
    return _measured_peaks(gpu.kernel_table)


# A rated copy's name says everything its ratios depend on (the stand-in tables, the measured
# rates, the compute units and the GPU's own peaks), so two profiles that agree on those share
# it, and one read from a user's file gets its own.
_rated: dict[str, GPUSpec] = {}


def _rated_name(gpu: GPUSpec) -> str:
    own = ",".join(f"{v:g}" for v in format_peaks(gpu).values())
    return f"{gpu.kernel_table}@{gpu.gemm_rates}:{gpu.sms}:{own}"


def _peaks(name: str) -> dict[str, float]:
    """The peaks an efficiency divides a table's rate by: those of the chip a table was
    measured on; for a rated copy, its training GEMM formats' divided by the GPU's measured
    ratios (an efficiency is rate / peak), the serving ones ("fmt:serving") left as they are:
    the ratios come from training-sized GEMMs, a serving step's run at a few rows."""
    table, _, rated = name.partition("@")
    base = _measured_peaks(table)
    if not rated:
        return base
    ratios = gemm_ratios(_rated[name], base)
    out = {**base, **{f"{fmt}:serving": peak for fmt, peak in base.items()}}
    out |= {fmt: base[fmt] / r.ratio for fmt, r in ratios.items()}
    # Flash attention is 16-bit matrix-core work as a bf16 GEMM is: with no attention kernel
    # of the GPU measured, training's takes the bf16 GEMMs' ratio where one was measured.
    if "bf16" in ratios:
        out["attention"] = base["attention"] / ratios["bf16"].ratio
    return out


class _LazyPeaks(Sequence[dict[str, float]]):
    """The peaks by code, each worked out the first time a row needs it: a rated copy's read
    the stand-in's tables and the measured GEMM times, which a search on another GPU skips."""

    def __init__(self, names: list[str]) -> None:
        self._names = names  # shared with _tables and _LazyTables

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
def _tables() -> tuple[list[str], KernelSet]:
    """The tables some GPU profile names and the package ships, in name order; the catalog's
    rated copies, in name order (their ratios worked out only when a row needs them), so every
    process numbers them alike; then the rated copies of profiles read from files, as they
    ask (`table_code` appends them: codes already given never move)."""
    gpus = catalog.gpus().values()
    names = sorted({g.kernel_table for g in gpus if g.kernel_table} & set(kernel_chips()))
    rated = {_rated_name(g): g for g in gpus if g.gemm_rates and g.kernel_table in names}
    _rated.update(rated)
    names += sorted(rated)
    return names, KernelSet(_LazyTables(names), _LazyPeaks(names))


def kernel_set() -> KernelSet:
    """Every shipped table, in the order `table_code` numbers them."""
    return _tables()[1]


def _rated_code(gpu: GPUSpec, names: list[str]) -> int:
    """The code of `gpu`'s rated copy of its stand-in tables, made the first time it is asked
    for; its ratios are worked out here, so rates that do not cover the GPU are one line."""
    name = _rated_name(gpu)
    if name not in names:
        gemm_ratios(gpu, stand_in_peaks(gpu))  # raises UserError on rates that do not cover it
        _rated[name] = gpu
        names.append(name)
    return names.index(name)


def table_code(gpu: GPUSpec) -> int:
    """The index of `gpu`'s tables in `kernel_set()`, -1 where it has none (its efficiency
    constants time its GEMMs and attention)."""
    names = _tables()[0]
    if gpu.kernel_table not in names:
        return -1
    code = _rated_code(gpu, names) if gpu.gemm_rates else names.index(gpu.kernel_table)
    if gpu.kernel_table_stand_in and gpu.name not in _told:
        _told.add(gpu.name)
        note = f"{gpu.name}: timed by {gpu.kernel_table_stand_in}"
        if gpu.gemm_rates:
            ratios = gemm_ratios(gpu, stand_in_peaks(gpu))
            note += f"; training GEMMs at its measured efficiency over theirs: {describe(ratios)}"
        print(note, file=sys.stderr)
    return code
