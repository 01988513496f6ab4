"""Which measured kernel tables time each GPU: the codes of CostInputs.kernel_chip and the
table set they index.

A GPU profile names its tables (`GPUSpec.kernel_table`, a folder of profiles/kernels/). A
table's rates become efficiencies against the datasheet peaks of the GPU it was measured on
(the profile naming it without a stand-in note), so a GPU timed by another's tables (a
stand-in) runs at those efficiencies times its own peaks; such a GPU is named once on stderr
with the reason its profile gives.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from functools import lru_cache
from typing import overload

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
        table = kernel_tables(self._names[code])
        if table is None:  # the folder was listed as shipped a moment ago
            raise FileNotFoundError(f"kernel tables '{self._names[code]}' are missing")
        return table


@lru_cache(maxsize=1)
def _tables() -> tuple[tuple[str, ...], KernelSet]:
    """The tables some GPU profile names and the package ships, in name order, with the
    peaks of the GPU each was measured on."""
    gpus = catalog.gpus().values()
    shipped = set(kernel_chips())
    names = tuple(sorted({g.kernel_table for g in gpus if g.kernel_table} & shipped))
    peaks = []
    for name in names:
        native = [g for g in gpus if g.kernel_table == name and not g.kernel_table_stand_in]
        owner = native[0] if native else next(g for g in gpus if g.kernel_table == name)
        peak = owner.peak_tflops
        peaks.append(
            {fmt: peak.get(p) or peak.get("fp8") or peak["bf16"] for fmt, p in FORMAT_PEAK.items()}
        )
    return names, KernelSet(_LazyTables(names), tuple(peaks))


def kernel_set() -> KernelSet:
    """Every shipped table, in the order `table_code` numbers them."""
    return _tables()[1]


def table_code(gpu: GPUSpec) -> int:
    """The index of `gpu`'s tables in `kernel_set()`, -1 where it has none (its efficiency
    constants time its GEMMs and attention)."""
    names = _tables()[0]
    if gpu.kernel_table not in names:
        return -1
    if gpu.kernel_table_stand_in and gpu.name not in _told:
        _told.add(gpu.name)
        print(f"{gpu.name}: timed by {gpu.kernel_table_stand_in}", file=sys.stderr)
    return names.index(gpu.kernel_table)
