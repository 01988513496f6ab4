"""Measured kernel tables (GEMM, attention, NCCL, fused MoE) as pure arrays, and their lookups.

autoconfig.columns.kernel_catalog reads them from the package; nothing here touches files.
Every table is a quantity on a regular grid over its axes; a lookup interpolates log(value)
multilinearly in log2(coordinate), since kernel throughput and collective time vary smoothly
in log-log terms between the measured sizes, and clamps coordinates to the measured range.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

Col = np.ndarray


@dataclass(frozen=True)
class Grid:
    """A measured quantity on a regular grid over log2 axes."""

    axes: tuple[np.ndarray, ...]  # each strictly increasing, positive
    values: np.ndarray  # achieved TFLOP/s (or us for nccl) on the grid
    # Derived once: log2 of the axes and log of the values, what every lookup interpolates, and
    # per axis a bucket table finding a coordinate's cell (see _cells).
    _log_axes: tuple[np.ndarray, ...] = field(init=False, repr=False, compare=False)
    _log_values: np.ndarray = field(init=False, repr=False, compare=False)
    _buckets: tuple[tuple[float, np.ndarray], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        axes = tuple(np.asarray(a, dtype=np.float64) for a in self.axes)
        values = np.asarray(self.values, dtype=np.float64)
        if values.shape != tuple(len(a) for a in axes):
            raise ValueError(
                f"values of shape {values.shape} on axes of lengths {[len(a) for a in axes]}"
            )
        for a in axes:
            if a.ndim != 1 or len(a) == 0 or a[0] <= 0 or np.any(np.diff(a) <= 0):
                raise ValueError("each axis must be 1-D, positive and strictly increasing")
        if not np.all(np.isfinite(values)) or np.any(values <= 0):
            raise ValueError("grid values must be finite and positive")
        object.__setattr__(self, "axes", axes)
        object.__setattr__(self, "values", values)
        object.__setattr__(self, "_log_axes", tuple(np.log2(a) for a in axes))
        object.__setattr__(self, "_log_values", np.log(values))
        object.__setattr__(self, "_buckets", tuple(_bucket_table(np.log2(a)) for a in axes))


def _bucket_table(la: np.ndarray) -> tuple[float, np.ndarray]:
    """Uniform buckets over log2 of an axis, half its narrowest cell wide, each mapped to the cell
    its start lies in: a bucket then holds at most one cell boundary, so a point's cell is its
    bucket's, or the next one, one comparison away. About 5x faster than np.searchsorted."""
    if len(la) < 2:
        return 1.0, np.zeros(1, dtype=np.intp)
    step = float(np.min(np.diff(la))) / 2
    starts = la[0] + step * np.arange(int(np.ceil((la[-1] - la[0]) / step)) + 1)
    cells = np.clip(np.searchsorted(la, starts, side="right") - 1, 0, len(la) - 2)
    return 1.0 / step, cells.astype(np.intp)


def _cells(x: np.ndarray, la: np.ndarray, bucket: tuple[float, np.ndarray]) -> np.ndarray:
    """Index i of the cell [la[i], la[i+1]] holding each x (x within [la[0], la[-1]])."""
    inv_step, cells = bucket
    u = ((x - la[0]) * inv_step).astype(np.intp)
    np.clip(u, 0, len(cells) - 1, out=u)
    i = cells[u]
    i += x >= la[i + 1]
    np.minimum(i, len(la) - 2, out=i)
    return i


def grid_lookup(grid: Grid, *coords: Col) -> Col:
    """multilinear interpolation of log(values) in log2(coords), coords clamped to the axes' ends;
    vectorized, broadcasting"""
    if len(coords) != len(grid.axes):
        raise ValueError(f"{len(coords)} coordinates for a {len(grid.axes)}-axis grid")
    arrays = np.broadcast_arrays(*(np.asarray(c) for c in coords))
    shape = arrays[0].shape
    arrays = [np.atleast_1d(a) for a in arrays]  # scalars too go through the in-place steps
    # float32 columns (the search's) stay float32: half the memory traffic, ample precision.
    dtype = np.result_type(*arrays, np.float32)
    lv = grid._log_values.astype(dtype, copy=False).ravel()
    strides = np.cumprod((1, *grid.values.shape[:0:-1]))[::-1]
    base = np.zeros(arrays[0].shape, dtype=np.intp)
    weights: list[np.ndarray] = []  # per interpolated axis, the upper neighbour's weight
    offsets = [0]  # flat offset of each cell corner, bit b of its index = upper on axis b
    axes = zip(arrays, grid.axes, grid._log_axes, grid._buckets, strides, strict=True)
    for c, a, la, bucket, stride in axes:
        if len(la) == 1:
            continue  # one measured value along this axis: constant
        x = np.log2(np.clip(c, a[0], a[-1]).astype(dtype, copy=False))
        lad = la.astype(dtype)
        i = _cells(x, lad, bucket)
        lo = lad[i]
        weights.append((x - lo) / (lad[i + 1] - lo))
        base += i * int(stride)
        offsets += [o + int(stride) for o in offsets]
    # Gather the cell's 2^d corners, then fold them one axis at a time (2^d - 1 lerps).
    corners = [lv[base + o] if o else lv[base] for o in offsets]
    for w in weights:
        corners = [lo + w * (hi - lo) for lo, hi in zip(corners[::2], corners[1::2], strict=True)]
    return np.exp(corners[0]).reshape(shape)


@dataclass(frozen=True)
class MoeShape:
    """One measured MoE layer shape: its time by tokens at each expert (tp, ep) split."""

    hidden: float
    inter: float
    experts: float
    topk: float
    splits: dict[tuple[int, int], Grid]  # (expert tp, ep) -> Grid over tokens, values in us


@dataclass(frozen=True)
class KernelTables:
    """One chip's tables."""

    chip: str
    gemm: dict[str, Grid]  # dtype -> Grid over (m, n, k), achieved TFLOP/s
    attention: Grid  # over (head_dim, seq, heads), achieved TFLOP/s of the causal forward
    nccl: dict[str, Grid]  # op -> Grid over (gpus, bytes), values in us
    source: str  # one-line provenance summary
    # Serving engines' own TP all-reduce: engine -> Grid over (gpus, bytes), values in us.
    engine_allreduce: dict[str, Grid] = field(default_factory=dict)
    # The fused MoE layer (routed experts): (dtype, gated) -> the measured model shapes.
    moe: dict[tuple[str, bool], tuple[MoeShape, ...]] = field(default_factory=dict)
    # Derived once: the GEMM grids with time never falling as rows grow, what a serving step's
    # few-row GEMMs are looked up in (monotone_in_rows).
    serving_gemm: dict[str, Grid] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        monotone = {fmt: monotone_in_rows(grid) for fmt, grid in self.gemm.items()}
        object.__setattr__(self, "serving_gemm", monotone)


def _table(tables: dict[str, Grid], key: str, what: str, chip: str) -> Grid:
    """`tables[key]`, or one line naming what the chip's tables hold instead."""
    try:
        return tables[key]
    except KeyError:
        raise ValueError(
            f"{chip}: no {what} table for {key!r} (measured: {', '.join(sorted(tables))})"
        ) from None


def gemm_seconds(t: KernelTables, dtype: str, m: Col, n: Col, k: Col) -> Col:
    """Time of x[m, k] @ W[k, n]: 2mnk / (achieved TFLOP/s * 1e12); 0 where m*n*k == 0.

    Below a table's smallest m (or n, k) the time is that smallest size's: a GEMM does not get
    faster with fewer rows than its smallest tile. Above the largest, the achieved TFLOP/s stays
    that of the largest measured size (the clamp)."""
    grid = _table(t.gemm, dtype, "GEMM", t.chip)
    m, n, k = np.broadcast_arrays(np.asarray(m), np.asarray(n), np.asarray(k))
    mf, nf, kf = (np.maximum(c, a[0]) for c, a in zip((m, n, k), grid.axes, strict=True))
    tflops = grid_lookup(grid, mf, nf, kf)
    seconds = 2.0 * mf * nf * kf / (tflops * 1e12)
    return np.where(m * n * k == 0, 0.0, seconds).astype(tflops.dtype, copy=False)


def attention_seconds(t: KernelTables, head_dim: Col, seq: Col, heads: Col) -> Col:
    """Causal flash-attention forward time: 2*heads*seq^2*head_dim FLOPs / achieved TFLOP/s,
    `heads` counting parallel (sequence, query head) pairs, batch x query heads per rank."""
    tflops = grid_lookup(t.attention, head_dim, seq, heads)
    flops = 2.0 * np.asarray(heads) * np.square(np.asarray(seq, dtype=tflops.dtype)) * head_dim
    return (flops / (tflops * 1e12)).astype(tflops.dtype, copy=False)


def collective_seconds(t: KernelTables, op: str, gpus: Col, nbytes: Col) -> Col:
    """Time of one NCCL collective over `gpus` ranks on a whole buffer of `nbytes` (all-reduce's
    buffer, all-gather's output, reduce-scatter's input); 0 where gpus <= 1 or nbytes <= 0.

    Beyond the largest measured size the time grows in proportion to bytes (the largest size's
    bandwidth); below the smallest it is the smallest's latency. Rank counts beyond the measured
    ones (one node's: 8, or 4 of an NVL72 rack) are NaN: a ring over more ranks takes more
    steps, so the caller models them (cost.comm)."""
    grid = _table(t.nccl, op, "NCCL", t.chip)
    gpus, nbytes = np.broadcast_arrays(np.asarray(gpus), np.asarray(nbytes))
    top = grid.axes[1][-1]
    us = grid_lookup(grid, gpus, np.minimum(nbytes, top))
    us = us * np.maximum(nbytes / top, 1.0)
    us = np.where(gpus > grid.axes[0][-1], np.nan, us)
    return np.where((gpus <= 1) | (nbytes <= 0), 0.0, us * 1e-6).astype(us.dtype, copy=False)


def engine_all_reduce_seconds(
    t: KernelTables, engine: str, gpus: Col | float, nbytes: Col | float
) -> Col:
    """Time of one all-reduce of `nbytes` over `gpus` ranks by `engine`'s own kernels (its
    custom all-reduce), as measured; NaN where the chip's tables hold none for the engine or
    the rank count is beyond the measured ones, 0 where gpus <= 1. Beyond the largest size the
    time grows in proportion to bytes; below the smallest it is the smallest's."""
    gpus, nbytes = np.broadcast_arrays(np.asarray(gpus, float), np.asarray(nbytes, float))
    grid = t.engine_allreduce.get(engine)
    if grid is None:
        return np.where(gpus <= 1, 0.0, np.nan)
    top = grid.axes[1][-1]
    us = grid_lookup(grid, np.maximum(gpus, grid.axes[0][0]), np.minimum(nbytes, top))
    us = us * np.maximum(nbytes / top, 1.0)
    us = np.where(gpus > grid.axes[0][-1], np.nan, us)
    return np.where(gpus <= 1, 0.0, us * 1e-6)


def least_at_or_above(times: np.ndarray, axis: int = 0) -> np.ndarray:
    """Each point's time the least measured at it or at any larger coordinate along `axis`: a
    smaller problem can always run padded as a larger one would, so its time never exceeds
    the larger one's. The tables' small sizes scatter with the kernel each picks; a search
    must not find one more sequence (or token) making a step faster."""
    return np.flip(np.minimum.accumulate(np.flip(times, axis), axis=axis), axis)


def monotone_in_rows(grid: Grid) -> Grid:
    """`grid` (a GEMM's TFLOP/s over m, n, k) with each point's time the least at that m or
    any larger m of the same (n, k) (least_at_or_above). Interpolated in log space between
    points whose time does not fall with m, the time does not fall either."""
    rows = grid.axes[0].reshape(-1, *([1] * (grid.values.ndim - 1)))
    time = rows / grid.values  # in units of 2nk / 1e12: only its order along m matters
    return Grid(grid.axes, rows / least_at_or_above(time, axis=0))


# A model shape the MoE table did not measure is timed from the nearest measured one only
# within this factor on hidden, expert FFN width and experts per routed copy (E / k).
MOE_SHAPE_REACH = 4.0


def nearest_moe_shape(
    t: KernelTables,
    dtype: str,
    gated: bool,
    hidden: float,
    inter: float,
    experts: float,
    topk: float,
) -> MoeShape | None:
    """The measured shape a MoE layer of this shape is timed from: the same shape where
    measured, else the nearest in log2 distance over (hidden, inter, experts / topk) within
    MOE_SHAPE_REACH on each; None where none is (or the chip has no table for the dtype)."""
    best, best_d = None, np.inf
    for shape in t.moe.get((dtype, gated), ()):
        ratios = np.array(
            [
                hidden / shape.hidden,
                inter / shape.inter,
                (experts / topk) / (shape.experts / shape.topk),
            ]
        )
        logs = np.abs(np.log2(ratios))
        if np.any(logs > np.log2(MOE_SHAPE_REACH)):
            continue
        # Exact expert counts and top-k break ties: the same routing pattern.
        d = float(logs.sum()) + 1e-3 * (
            abs(np.log2(experts / shape.experts)) + abs(np.log2(topk / shape.topk))
        )
        if d < best_d:
            best, best_d = shape, d
    return best


def moe_seconds(
    t: KernelTables,
    dtype: str,
    gated: bool,
    shape: tuple[float, float, float, float],
    split: tuple[int, int],
    tokens: Col,
) -> Col | None:
    """Seconds of one fused MoE layer on one rank for `tokens` tokens under balanced routing,
    as measured for the model `shape` (hidden, expert FFN width, experts, top-k) at the expert
    (tp, ep) `split`; None where the table has neither the shape (nor one near it:
    nearest_moe_shape) nor the split.

    Between shapes: the nearest measured one at the tokens giving each expert the same routed
    copies (tokens x k / E), times E x hidden x inter over its own: at equal rows per expert
    the weights read and the FLOPs both scale so. Tokens are interpolated in log-log space;
    below one token the one-token time, beyond the largest measured count in proportion."""
    hidden, inter, experts, topk = shape
    near = nearest_moe_shape(t, dtype, gated, hidden, inter, experts, topk)
    if near is None or split not in near.splits:
        return None
    grid = near.splits[split]
    copies = (topk / experts) / (near.topk / near.experts)
    scale = (experts * hidden * inter) / (near.experts * near.hidden * near.inter)
    m = np.maximum(np.asarray(tokens, float) * copies, 1.0)
    top = grid.axes[0][-1]
    us = grid_lookup(grid, np.minimum(m, top)) * np.maximum(m / top, 1.0)
    return us * scale * 1e-6
