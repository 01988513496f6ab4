"""Serving time of the routed experts from the chip's measured fused-MoE table, with the load
imbalance of random routing and the expert-parallel all-to-all from the measured NCCL table.

A serving engine runs a MoE layer's routed experts as one fused kernel (TensorRT-LLM's CUTLASS
or DeepGEMM MoE: the tokens' permutation, grouped GEMMs, activation, unpermute). Its time is far
from a roofline of the expert GEMMs: Qwen3-30B-A3B in fp8 on an H200 takes 0.20 ms a layer at
256 tokens where the roofline of its weights gives 0.13, and 0.34 ms at 2048 tokens where the
roofline of its FLOPs gives 0.08 (the grouped GEMMs of 128 experts of 2048 x 768 run small
tiles). So the table's time at the iteration's tokens replaces the routed GEMMs wherever the
chip measured the model's format and shape (kernel_tables.moe_seconds, which also times a shape
near a measured one); the rest of the layer keeps its own terms.

The table routes tokens evenly (every expert gets tokens x k / E copies). A router spreads them
at random: with expert parallelism the ranks wait at the combine for the busiest one, whose
experts received more than the mean. For m = tokens x k copies thrown uniformly into n = ep
ranks the fullest rank holds about m/n + sqrt(2 (m/n) ln n) (Raab & Steger 1998, "Balls into
Bins - A Simple and Tight Analysis", Theorem 1, for m >= n ln n; an upper estimate below). The
layer is then looked up at the tokens that would give a rank that many copies under balanced
routing. Without expert parallelism one rank runs every expert: its grouped GEMMs spread all
experts' tiles over its SMs, so its time follows the total routed rows, not the busiest
expert's (the source's measurements under a power-law routing are within 15% of the balanced
ones at ep 1, up to 1.8x at ep 8), and no imbalance is added. The imbalance is relative
sqrt(2 ln n / (m/n)): large at decode's few tokens, vanishing at prefill's thousands.
"""

from __future__ import annotations

import numpy as np

from autoconfig.cost import kernel_time
from autoconfig.cost.inputs import SQUARED_RELU, SWIGLU, Col, CostInputs
from autoconfig.cost.kernel_tables import moe_seconds
from autoconfig.cost.serving_gemm import TOKEN_GRID


def busiest_rank_tokens(tokens: Col, topk: Col, experts: Col, ep: Col) -> Col:
    """Tokens that would give each of `ep` ranks, under balanced routing, the routed copies the
    busiest rank receives under uniform routing of `tokens` tokens to `topk` of `experts`:
    mean + sqrt(2 mean ln ep) copies (module docstring), at most every token's copies that
    can land on one rank, and no fewer than balanced routing's whole copy."""
    t = np.maximum(np.asarray(tokens, float), 0.0)
    k, e, n = (np.maximum(np.asarray(v, float), 1.0) for v in (topk, experts, ep))
    mean = t * k / n
    busiest = mean + np.sqrt(2.0 * mean * np.log(n))
    busiest = np.minimum(busiest, t * np.minimum(k, e / n))
    factor = np.maximum(busiest, 1.0) / np.maximum(mean, 1.0)
    return t * np.maximum(factor, 1.0)


def _gated(x: CostInputs) -> Col:
    """1 for gated experts (SwiGLU), 0 for squared ReLU, -1 for an activation with no table."""
    kind = np.asarray(x.mlp_kind)
    return np.select([kind == SWIGLU, kind == SQUARED_RELU], [1.0, 0.0], -1.0)


def layer_seconds(
    x: CostInputs,
    tokens: Col,
    ep: Col | float,
    weight_bytes: Col | float,
    act_bytes: Col | float,
) -> Col | None:
    """Seconds of an average layer's routed experts on one rank for `tokens` tokens (the MoE
    layer's time times the share of layers with one), from the measured table with the
    busiest rank's imbalance; NaN on rows it does not time (no table, another format or
    shape, weight-only quantisation, an expert split it did not measure), 0 on dense models;
    None where no row has tables."""
    if not x.kernels:
        return None
    n = int(
        np.prod(
            np.broadcast_shapes(
                np.shape(tokens), np.shape(x.kernel_chip), np.shape(x.tp), np.shape(ep)
            )
        )
    )
    weights = np.broadcast_to(np.asarray(weight_bytes, float), (n,))
    inputs = np.broadcast_to(np.asarray(act_bytes, float), (n,))
    ep_n = np.broadcast_to(np.asarray(ep, float), (n,))
    # A serving engine splits each expert over the tp ranks, or with expert parallelism the
    # experts themselves (ep = tp): expert tp is what ep leaves of tp.
    expert_tp = np.broadcast_to(np.asarray(x.tp, float), (n,)) / np.maximum(ep_n, 1.0)
    expert_h = np.where(x.moe_latent > 0, x.moe_latent, x.hidden)
    columns = [
        np.broadcast_to(np.asarray(c, float), (n,))
        for c in (
            np.where(np.asarray(x.kernel_chip) < len(x.kernels.tables), x.kernel_chip, -1.0),
            x.gemm_bytes,
            _gated(x),
            expert_h,
            x.expert_ffn,
            x.experts,
            x.topk,
            expert_tp,
            ep_n,
        )
    ]
    keys = np.stack(columns, axis=1)
    share = np.broadcast_to(np.asarray(x.moe_share * x.mlp_share, float), (n,))
    t = np.broadcast_to(np.asarray(tokens, float), (n,))
    # The table holds weights and inputs in one format: weight-only quantisation keeps the
    # roofline.
    usable = np.isclose(weights, inputs) & (inputs <= 2.0)
    out = np.where(np.broadcast_to(np.asarray(x.experts, float), (n,)) > 0, np.nan, 0.0)
    unique, inverse = np.unique(keys, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    for g, (code, nbytes, gated, h, inter, e, k, etp_g, ep_g) in enumerate(unique):
        if code < 0 or gated < 0 or e <= 0:
            continue
        rows = (inverse == g) & usable
        if not rows.any() or etp_g < 1 or etp_g != np.round(etp_g):
            continue
        table = x.kernels.tables[int(code)]
        available = {d: None for d, _ in table.moe}
        fmt = kernel_time.gemm_format(nbytes, available)
        busiest = busiest_rank_tokens(t[rows], k, e, ep_g)
        seconds = moe_seconds(
            table, fmt, bool(gated), (h, inter, e, k), (int(etp_g), int(ep_g)), busiest
        )
        if seconds is not None and fmt in available:
            out[rows] = seconds * share[rows]
    return out


def token_curve(
    x: CostInputs,
    layers: Col | float,
    ep: Col | float,
    weight_bytes: Col | float,
    act_bytes: Col | float,
    n: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Rows whose routed experts the table times, and their seconds per iteration (times
    `layers`) at serving_gemm.TOKEN_GRID tokens, [T, N] (0 off those rows)."""
    curve = np.zeros((len(TOKEN_GRID), n))
    if not x.kernels or not np.any(np.asarray(x.experts) > 0):
        return np.zeros(n, bool), curve
    for j, tokens in enumerate(TOKEN_GRID):
        seconds = layer_seconds(x, np.full(n, tokens), ep, weight_bytes, act_bytes)
        if seconds is None:
            return np.zeros(n, bool), curve
        curve[j] = np.broadcast_to(seconds, (n,))
    rows = np.isfinite(curve).all(axis=0) & (np.broadcast_to(np.asarray(x.experts), (n,)) > 0)
    return rows, np.where(rows, curve * np.broadcast_to(layers, (n,)), 0.0)


def all_to_all_seconds(
    x: CostInputs, tokens: Col, ep: Col | float, act_bytes: Col | float
) -> Col | None:
    """Seconds of an average layer's expert-parallel dispatch and combine on one rank for
    `tokens` tokens: two NCCL all-to-alls over the ep ranks of a buffer of the tokens' k copies
    of `act_bytes` x hidden each (each rank sending (ep-1)/ep of it), as measured within a node
    (NaN beyond the measured ranks or without a table; 0 without expert parallelism); None
    where no row has tables."""
    if not x.kernels:
        return None
    expert_h = np.where(x.moe_latent > 0, x.moe_latent, x.hidden)
    nbytes = np.asarray(tokens, float) * x.topk * act_bytes * expert_h
    ranks = np.asarray(ep, float)
    seconds = kernel_time.collective_time(x.kernels, x.kernel_chip, "alltoall", ranks, nbytes)
    if seconds is None:
        return None
    share = x.moe_share * x.mlp_share
    moe = (ranks > 1) & (np.asarray(x.experts) > 0)
    return np.where(moe, 2.0 * seconds * share, 0.0)
