"""Kernel times looked up in measured tables, each candidate on its own chip's table.

A candidate's GEMM, flash-attention and NCCL times come from the kernels measured on its chip
(`kernel_tables.KernelTables`, distilled by scripts/distill_kernel_tables.py) instead of a
peak times one fitted efficiency. A table gives the achieved TFLOP/s of a shape; divided by
the datasheet peak of the chip it was measured on it is that shape's efficiency, which times
the candidate's own GPU peak gives its rate. So a GPU without a table of its own (an H100 with
96 GB, an A100 with 40 GB) runs at its stand-in chip's efficiencies and its own datasheet
peak. Rows whose chip has no table (`kernel_chip` < 0) return None here and keep the
profile's efficiency constants.

Rows are grouped by chip and GEMM format, so a search over one GPU (scalar columns) makes one
table look-up per op, however many layouts it evaluates.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from autoconfig.cost.kernel_tables import (
    KernelTables,
    collective_seconds,
    engine_all_reduce_seconds,
    grid_lookup,
)

Col = np.ndarray

# Flash attention's backward over its forward, in time, on the same shape: 2.68-3.35 on one
# H100 (torch SDPA's flash kernels, causal, head_dim 128, 4 shapes on two machine starts:
# docs/measured/h100_kernels.json, h100_kernels_first_run.json), median 3.1. FlashAttention-2
# counts 2.5x the forward's FLOPs for backward (Dao 2023, Sec. 3.1.2) and runs them slower.
ATTENTION_BACKWARD_OVER_FORWARD = 3.1

# The same kernels as a training step runs them, over the tables' rates at the same shapes,
# measured on one H100 by scripts/bench_gpu_kernels.py (torch's cuBLAS GEMMs and SDPA's flash
# kernels, inputs rotated over three sets so no operand stays in L2 from the repeat before:
# docs/measured/h100_kernels.json, h100_kernels_first_run.json; tests/test_kernel_crosscheck.py):
# - bf16 GEMMs, 36 forward, input- and weight-gradient shapes: medians 0.90 and 0.85 on two
#   machine starts (0.66-1.01 by shape); the tables' engines time a GEMM repeated on the same
#   operands;
# - fp8 GEMMs, 3 forward shapes on one start: median 0.99 (0.94-1.10), taken for every 8- and
#   4-bit format;
# - causal flash attention forward, 4 shapes: medians 1.11 and 1.09 (0.87-1.26).
# Taken for every chip: no other chip was measured both ways.
TRAINING_OVER_TABLE = {"bf16": 0.875, "fp8": 0.99, "attention": 1.10}


@dataclass(frozen=True)
class KernelSet:
    """Measured tables by chip code (`CostInputs.kernel_chip` indexes `tables`) with the
    datasheet dense peak, TFLOP/s by table format, of the chip each was measured on (a rated
    copy's: "attention" for flash attention, "<format>:serving" for serving steps where
    they differ from training's; columns.kernel_index)."""

    tables: Sequence[KernelTables] = ()
    peaks: Sequence[dict[str, float]] = field(default=())

    def __bool__(self) -> bool:
        return bool(self.tables)


NO_KERNELS = KernelSet()


def gemm_format(gemm_bytes: float, available: Mapping[str, object]) -> str:
    """The table format a GEMM of `gemm_bytes` per operand element runs in: 16-bit, per-tensor
    fp8, block-scaled fp8 (mxfp8: 1 + 1/32 bytes) or nvfp4, falling back to the nearest wider
    format the chip's table has (its efficiency then applies to the candidate's own peak)."""
    if gemm_bytes >= 2.0:
        wanted = ["bf16"]
    elif gemm_bytes > 1.0:
        wanted = ["fp8_block", "fp8", "bf16"]
    elif gemm_bytes >= 1.0:
        wanted = ["fp8", "fp8_block", "bf16"]
    else:
        wanted = ["nvfp4", "fp8_block", "fp8", "bf16"]
    return next((f for f in wanted if f in available), "bf16")


def _per_chip(
    kernels: KernelSet,
    codes: Col,
    keys: Col | float,
    coords: tuple[Col, ...],
    value_of: Callable[[int, float, tuple[Col, ...]], Col],
) -> Col | None:
    """`value_of(code, key, coords)` for each (chip code, key) group of rows, as one column; None
    where no row has a table. Scalar codes and keys make one call on the whole columns."""
    # A code with no table in `kernels` (inputs built without the shipped set) has none.
    codes = np.where(np.asarray(codes) < len(kernels.tables), codes, -1.0)
    if not np.any(codes >= 0):
        return None
    if np.ndim(codes) == 0 and np.ndim(keys) == 0:
        return value_of(int(codes), float(keys), coords)
    n = int(np.prod(np.broadcast_shapes(np.shape(codes), np.shape(keys), *map(np.shape, coords))))
    codes_n = np.broadcast_to(codes, (n,))
    keys_n = np.broadcast_to(keys, (n,))
    full = [np.broadcast_to(c, (n,)) for c in coords]
    out = np.full(n, np.nan)
    for code in np.unique(codes_n[codes_n >= 0]):
        for key in np.unique(keys_n[codes_n == code]):
            rows = (codes_n == code) & (keys_n == key)
            out[rows] = value_of(int(code), float(key), tuple(c[rows] for c in full))
    return out


def gemm_efficiency(
    kernels: KernelSet,
    codes: Col,
    gemm_bytes: Col | float,
    m: Col,
    n: Col,
    k: Col,
    *,
    in_training: bool = True,
) -> Col | None:
    """Fraction of the format's dense peak a GEMM of m x k by k x n (m tokens) reaches on each
    row's chip, from its measured table (NaN on rows without one; None if no row has one).
    `in_training` carries the table to a training step (TRAINING_OVER_TABLE); a serving engine
    runs the kernels the tables measured, as they measured them."""

    def efficiency(code: int, nbytes: float, mnk: tuple[Col, ...]) -> Col:
        table, peaks = kernels.tables[code], kernels.peaks[code]
        fmt = gemm_format(nbytes, table.gemm)
        m_, n_, k_ = (np.maximum(np.asarray(c, float), 1.0) for c in mnk)
        over = TRAINING_OVER_TABLE["bf16" if fmt == "bf16" else "fp8"] if in_training else 1.0
        # A serving step's GEMMs run at a few rows, where the tables scatter by kernel choice.
        grid = table.gemm[fmt] if in_training else table.serving_gemm[fmt]
        peak = peaks[fmt] if in_training else peaks.get(f"{fmt}:serving", peaks[fmt])
        return grid_lookup(grid, m_, n_, k_) * over / peak

    return _per_chip(kernels, codes, gemm_bytes, (m, n, k), efficiency)


def attention_efficiency(
    kernels: KernelSet,
    codes: Col,
    head_dim: Col,
    seq: Col,
    heads: Col,
    *,
    in_training: bool = True,
) -> Col | None:
    """Fraction of the 16-bit dense peak causal flash attention's forward reaches over `heads`
    parallel (sequence, head) pairs of `seq` tokens with `head_dim`, on each row's chip;
    `in_training` carries the table to a training step's kernels (TRAINING_OVER_TABLE)."""
    over = TRAINING_OVER_TABLE["attention"] if in_training else 1.0

    def efficiency(code: int, _: float, coords: tuple[Col, ...]) -> Col:
        table, peaks = kernels.tables[code], kernels.peaks[code]
        d, s, h = (np.maximum(np.asarray(c, float), 1.0) for c in coords)
        rate = grid_lookup(table.attention, d, s, h) * over
        peak = peaks.get("attention", peaks["bf16"])
        return rate / (peak if in_training else peaks.get("attention:serving", peak))

    return _per_chip(kernels, codes, np.float32(0.0), (head_dim, seq, heads), efficiency)


def collective_time(kernels: KernelSet, codes: Col, op: str, size: Col, nbytes: Col) -> Col | None:
    """Seconds of one NCCL collective (`op`: all_reduce, all_gather, reduce_scatter, alltoall)
    over `size` ranks of one NVLink domain on a whole buffer of `nbytes` (alltoall's: what
    each rank sends, (size-1)/size of it to other ranks), as measured on each row's chip
    (NaN on rows without a table; None if no row has one)."""

    def seconds(code: int, _: float, coords: tuple[Col, ...]) -> Col:
        ranks, buffer = (np.asarray(c, float) for c in coords)
        return collective_seconds(kernels.tables[code], op, ranks, buffer)

    return _per_chip(kernels, codes, np.float32(0.0), (size, nbytes), seconds)


def serving_all_reduce_time(
    kernels: KernelSet,
    codes: Col,
    kinds: Col | float,
    names: Sequence[str],
    size: Col,
    nbytes: Col,
) -> Col | None:
    """Seconds of one TP all-reduce of `nbytes` over `size` ranks as each row's serving engine
    runs it (`names[kind]`: NCCL's for "library", else the engine's own kernels), measured
    on its chip; NaN where the chip's tables lack it or the ranks are beyond the measured ones
    (None if no row has tables)."""

    def seconds(code: int, kind: float, coords: tuple[Col, ...]) -> Col:
        ranks, buffer = (np.asarray(c, float) for c in coords)
        table, name = kernels.tables[code], names[int(kind)]
        if name == "library":
            return collective_seconds(table, "all_reduce", ranks, buffer)
        return engine_all_reduce_seconds(table, name, ranks, buffer)

    return _per_chip(kernels, codes, kinds, (size, nbytes), seconds)


def kernel_floor(kernels: KernelSet, codes: Col) -> Col | None:
    """Seconds the smallest kernel takes on each row's chip: its table's smallest GEMM (one row
    of 32 x 32, 16-bit), which moves a few bytes and does next to no work, timed back to back as
    the tables time every kernel. A kernel whose work is smaller still takes this long."""

    def seconds(code: int, _: float, coords: tuple[Col, ...]) -> Col:
        grid = kernels.tables[code].gemm["bf16"]
        m, n, k = (float(a[0]) for a in grid.axes)
        tflops = grid_lookup(grid, np.array([m]), np.array([n]), np.array([k]))[0]
        return np.full(np.shape(coords[0]), 2.0 * m * n * k / (tflops * 1e12))

    return _per_chip(kernels, codes, np.float32(0.0), (np.asarray(codes, float),), seconds)


def eager_launch(kernels: KernelSet, codes: Col) -> Col | None:
    """Seconds the host takes to launch one kernel from Python, outside a CUDA graph: the same
    engine's smallest all-reduce launched eagerly less the one replayed from a graph (vLLM's,
    two ranks), measured on each row's chip and its host. NaN where the tables lack either."""

    def seconds(code: int, _: float, coords: tuple[Col, ...]) -> Col:
        table = kernels.tables[code]
        if "vllm_eager" not in table.engine_allreduce or "vllm" not in table.engine_allreduce:
            return np.full(np.shape(coords[0]), np.nan)
        smallest = table.engine_allreduce["vllm"].axes[1][0]
        eager = engine_all_reduce_seconds(table, "vllm_eager", 2.0, smallest)
        graph = engine_all_reduce_seconds(table, "vllm", 2.0, smallest)
        return np.full(np.shape(coords[0]), float(np.maximum(eager - graph, 0.0)))

    return _per_chip(kernels, codes, np.float32(0.0), (np.asarray(codes, float),), seconds)
