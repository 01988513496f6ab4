"""Loads the measured kernel tables shipped in autoconfig/profiles/kernels/ into Grids.

The cost layer (autoconfig.cost.kernel_tables) holds the arrays and lookups and reads no files;
this spec-layer module reads each chip folder's gemm.csv (or gemm.csv.gz), attention.csv,
nccl.csv, allreduce.csv (the serving engines' own all-reduce, where measured), moe.csv (the
fused MoE layer, where measured) and provenance.yaml, distilled from aiconfigurator-core's
measurements (Apache-2.0) by scripts/distill_kernel_tables.py.
"""

from __future__ import annotations

import gzip
import io
from functools import cache
from importlib.resources import files
from importlib.resources.abc import Traversable

import numpy as np
import pandas as pd

from autoconfig.cost.kernel_tables import Grid, KernelTables, MoeShape, least_at_or_above


def kernels_folder() -> Traversable:
    """The packaged folder of measured kernel tables, one subfolder per chip."""
    return files("autoconfig") / "profiles" / "kernels"


def kernel_chips() -> list[str]:
    """The chips with shipped tables."""
    folder = kernels_folder()
    if not folder.is_dir():
        return []
    return sorted(p.name for p in folder.iterdir() if (p / "provenance.yaml").is_file())


def _read_csv(folder: Traversable, name: str) -> pd.DataFrame:
    plain, packed = folder / name, folder / f"{name}.gz"
    if plain.is_file():
        return pd.read_csv(io.BytesIO(plain.read_bytes()))
    if packed.is_file():
        return pd.read_csv(io.BytesIO(gzip.decompress(packed.read_bytes())))
    raise FileNotFoundError(f"{folder}: no {name}")


def _grid(frame: pd.DataFrame, axes: list[str], value: str, where: str) -> Grid:
    """A Grid from the rows of a full regular grid (any row order)."""
    levels = [np.sort(frame[a].unique()) for a in axes]
    shape = tuple(len(lv) for lv in levels)
    if len(frame) != int(np.prod(shape)) or frame.duplicated(axes).any():
        raise ValueError(f"{where}: rows do not form a full regular grid over {', '.join(axes)}")
    ordered = frame.sort_values(axes)
    return Grid(
        tuple(lv.astype(np.float64) for lv in levels),
        ordered[value].to_numpy(np.float64).reshape(shape),
    )


def _monotone(grid: Grid) -> Grid:
    """A MoE layer's time over tokens, never falling as tokens grow (least_at_or_above)."""
    return Grid(grid.axes, least_at_or_above(grid.values, axis=0))


def _moe_shapes(folder: Traversable, chip: str) -> dict[tuple[str, bool], tuple[MoeShape, ...]]:
    """The fused MoE table by (dtype, gated): each measured shape's time over tokens per
    (expert tp, ep) split; empty where the chip has none."""
    if not ((folder / "moe.csv").is_file() or (folder / "moe.csv.gz").is_file()):
        return {}
    frame = _read_csv(folder, "moe.csv")
    out: dict[tuple[str, bool], tuple[MoeShape, ...]] = {}
    shape_keys = ["hidden", "inter", "experts", "topk"]
    for (dtype, gated), kind in frame.groupby(["dtype", "gated"], sort=False):
        shapes = []
        for (h, i, e, k), rows in kind.groupby(shape_keys, sort=True):
            splits = {
                (int(tp), int(ep)): _monotone(
                    _grid(g, ["tokens"], "us", f"{chip} moe {dtype} {h}x{i}")
                )
                for (tp, ep), g in rows.groupby(["tp", "ep"], sort=True)
            }
            shapes.append(MoeShape(float(h), float(i), float(e), float(k), splits))
        out[(str(dtype), bool(gated))] = tuple(shapes)
    return out


@cache
def kernel_tables(chip: str) -> KernelTables | None:
    """One chip's measured tables, or None where the chip has none shipped."""
    folder = kernels_folder() / chip
    if not chip or not (folder / "provenance.yaml").is_file():
        return None
    gemm = _read_csv(folder, "gemm.csv")
    att = _read_csv(folder, "attention.csv")
    nccl = _read_csv(folder, "nccl.csv")
    # The serving engines' own all-reduce, where the chip's tables measured one.
    measured_engines = (folder / "allreduce.csv").is_file()
    allreduce = _read_csv(folder, "allreduce.csv") if measured_engines else None
    return KernelTables(
        moe=_moe_shapes(folder, chip),
        chip=chip,
        gemm={
            str(d): _grid(g, ["m", "n", "k"], "tflops", f"{chip} gemm {d}")
            for d, g in gemm.groupby("dtype", sort=False)
        },
        attention=_grid(att, ["head_dim", "seq", "heads"], "tflops", f"{chip} attention"),
        nccl={
            str(op): _grid(g, ["gpus", "bytes"], "us", f"{chip} nccl {op}")
            for op, g in nccl.groupby("op", sort=False)
        },
        # provenance.yaml is for people: parsing it costs more than the tables themselves
        source=f"profiles/kernels/{chip}/provenance.yaml",
        engine_allreduce={}
        if allreduce is None
        else {
            str(e): _grid(g, ["gpus", "bytes"], "us", f"{chip} allreduce {e}")
            for e, g in allreduce.groupby("engine", sort=False)
        },
    )
