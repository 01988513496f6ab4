"""Serving GEMM times from the chip's measured GEMM tables, at the tokens an iteration runs.

A serving engine runs its linear layers with the kernels the tables measured (TensorRT-LLM's
cuBLAS / cuBLASLt bf16 and fp8 GEMMs, its nvfp4 GEMM: scripts/distill_kernel_tables.py), so a
GEMM of m tokens takes the table's time at (m, n, k), as measured, instead of a roofline of a
fitted efficiency and the HBM bandwidth. At the few tokens of a decode step the table is what
the GEMM really costs: at m = 1 an H100's fp8 GEMM streams its weights at about half of the
HBM bandwidth, its bf16 GEMM at about four fifths (the h100 table), where the roofline assumed
one fitted share for both.

Where the table applies: the weights and the GEMM's inputs share one format the table has
(16-bit, fp8, nvfp4), or the weights are int8 / int4 under 16-bit inputs (weight-only: the
kernel dequantises them and computes in 16 bits). No table holds a weight-only kernel, so one
takes the 16-bit GEMM's time scaled by its weight bytes where the 16-bit one streams weights
(small m), and the 16-bit GEMM's compute rate where that is slower (large m). fp32 and chips
without tables keep the roofline (inference._gemm, serving_step's coefficients). Routed
experts run as one fused grouped kernel, not these GEMMs: serving_moe times them from the MoE
table, and they keep the roofline where it does not reach.
"""

from __future__ import annotations

import numpy as np

from autoconfig.cost import kernel_time
from autoconfig.cost.inputs import Col, CostInputs
from autoconfig.cost.layer import Op

# Token counts an iteration's GEMM curve is looked up at: 1 to 32,768, the tables' m range.
TOKEN_GRID = 2.0 ** np.arange(16)


def applies(x: CostInputs, weight_bytes: Col | float, act_bytes: Col | float) -> np.ndarray:
    """Rows whose dense GEMMs the measured tables time: a chip with tables, and weights in the
    format the GEMM computes in (no weight-only quantisation, no fp32)."""
    weights, inputs = np.asarray(weight_bytes, float), np.asarray(act_bytes, float)
    same_format = np.isclose(weights, inputs) & (inputs <= 2.0)
    weight_only = (weights < 2.0) & np.isclose(inputs, 2.0)
    return (np.asarray(x.kernel_chip) >= 0) & (same_format | weight_only)


# The rows of a GEMM at which the 16-bit tables stand for its compute rate (compute-bound on
# every measured chip), what a weight-only GEMM reaches once its weights no longer dominate.
COMPUTE_BOUND_TOKENS = 4096.0


def measured_seconds(
    x: CostInputs,
    op: Op,
    tokens: Col,
    rows: np.ndarray,
    weight_bytes: Col | float = 2.0,
) -> Col | None:
    """Seconds of one dense GEMM over `tokens` tokens on one rank, from the table (made
    monotone in m: KernelTables.serving_gemm), NaN where `rows` is false or the chip has
    no table; None where no row has one. `weight_bytes` below the inputs' 16 bits makes it a
    weight-only GEMM (the module's docstring)."""
    if op.routed or not x.kernels or not np.any(rows):
        return None
    weights = np.asarray(weight_bytes, float)
    weight_only = (weights < 2.0) & np.isclose(np.asarray(x.gemm_bytes, float), 2.0)
    if np.any(weight_only) and not op.sixteen_bit:
        sixteen = measured_seconds(x, op, tokens, rows)
        if sixteen is None:
            return None
        big = np.broadcast_to(COMPUTE_BOUND_TOKENS, np.shape(sixteen))
        at_large = measured_seconds(x, op, big, rows)
        m = np.maximum(np.asarray(tokens, float), 1.0)
        compute = at_large * m / COMPUTE_BOUND_TOKENS if at_large is not None else 0.0
        dequantised = np.maximum(sixteen * weights / 2.0, compute)
        return np.where(weight_only, dequantised, sixteen)
    m = np.maximum(np.asarray(tokens, float), 1.0)
    n, k = op.tile_width, np.maximum(op.gemm_k, 1.0)
    # The LM head stays 16-bit under 8- and 4-bit recipes (Op.sixteen_bit).
    nbytes, peak = (2.0, x.peak_bf16_flops) if op.sixteen_bit else (x.gemm_bytes, x.peak_flops)
    eff = kernel_time.gemm_efficiency(x.kernels, x.kernel_chip, nbytes, m, n, k, in_training=False)
    if eff is None:
        return None
    # Below one token (a pipeline stage's share of a small batch) the GEMM still runs whole.
    seconds = op.flops * m / (peak * eff)
    return np.where(rows & op.present, seconds, np.where(op.present, np.nan, 0.0))


def token_curve(
    x: CostInputs,
    ops: list[Op],
    layers: Col | float,
    rows: np.ndarray,
    weight_bytes: Col | float = 2.0,
) -> np.ndarray | None:
    """[T, N]: seconds of the dense GEMMs in `ops`, times `layers`, at each TOKEN_GRID count,
    per deployment (NaN on rows the tables do not time); None where none does."""
    n = len(np.atleast_1d(np.asarray(x.kernel_chip)))
    n = max(n, len(np.atleast_1d(rows)))
    dense = [op for op in ops if op.kind == "gemm" and not op.routed]
    curve = np.zeros((len(TOKEN_GRID), n))
    for j, tokens in enumerate(TOKEN_GRID):
        for op in dense:
            seconds = measured_seconds(x, op, np.full(n, tokens), rows, weight_bytes)
            if seconds is None:
                return None
            curve[j] += np.broadcast_to(seconds, (n,))
    return curve * np.broadcast_to(layers, (n,))


def on_curve(curve: np.ndarray, tokens: Col) -> Col:
    """The curve at each deployment's `tokens`: log-log interpolation between grid counts,
    the one-token time below one token, and proportional to tokens above the grid's top."""
    steps, n = curve.shape
    t = np.broadcast_to(np.asarray(tokens, float), (n,))
    position = np.clip(np.log2(np.maximum(t, 1.0)), 0.0, steps - 1.0)
    lower = np.minimum(position.astype(np.intp), steps - 2)
    weight = position - lower
    cols = np.arange(n)
    log_lo = np.log(np.maximum(curve[lower, cols], 1e-30))
    log_hi = np.log(np.maximum(curve[lower + 1, cols], 1e-30))
    value = np.exp(log_lo + weight * (log_hi - log_lo))
    beyond = np.maximum(t / TOKEN_GRID[-1], 1.0)
    return value * beyond
