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
from functools import lru_cache

from autoconfig import catalog
from autoconfig.cost.kernel_time import KernelSet
from autoconfig.kernel_catalog import kernel_tables
from autoconfig.specs import GPUSpec

# The profile precision whose peak each table format is measured against.
FORMAT_PEAK = {"bf16": "bf16", "fp8": "fp8", "fp8_block": "fp8", "nvfp4": "nvfp4"}

_told: set[str] = set()


@lru_cache(maxsize=1)
def _tables() -> tuple[tuple[str, ...], KernelSet]:
    """The tables some GPU profile names, in name order, with the peaks of the GPU each was
    measured on."""
    gpus = catalog.gpus().values()
    names = sorted({g.kernel_table for g in gpus if g.kernel_table})
    tables, peaks, found = [], [], []
    for name in names:
        table = kernel_tables(name)
        if table is None:
            continue
        native = [g for g in gpus if g.kernel_table == name and not g.kernel_table_stand_in]
        owner = native[0] if native else next(g for g in gpus if g.kernel_table == name)
        peak = owner.peak_tflops
        peaks.append(
            {fmt: peak.get(p) or peak.get("fp8") or peak["bf16"] for fmt, p in FORMAT_PEAK.items()}
        )
        tables.append(table)
        found.append(name)
    return tuple(found), KernelSet(tuple(tables), tuple(peaks))


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
