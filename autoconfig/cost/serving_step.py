"""Time of one continuous-batching iteration: a mixed batch of prefill-chunk tokens and decoding
sequences through the busiest pipeline stage, as per-deployment coefficients built once from the
per-layer op list (layer.py) so a scheduler simulation can evaluate thousands of iterations.

One iteration runs every layer once over all its tokens (Yu et al. 2022, "Orca", Sec. 4:
iteration-level scheduling; Agrawal et al. 2024, "Sarathi-Serve": chunked prefills share the
iteration with decodes):
- each GEMM takes the roofline max of its FLOPs at the engine's GEMM efficiency and its bytes
  (the weights once per iteration, activations per token) at the streaming bandwidth (Williams
  et al. 2009; Pope et al. 2022, Sec. 3); MoE layers read only the experts the iteration's
  tokens are routed to, E*(1 - (1 - k/E)^T) in expectation (Fedus et al. 2022);
- attention of prefill tokens costs 4*heads*head_dim/tp FLOPs per (query, key) pair, causal
  within the prompt; a decoding sequence's one query reads its whole cached context, so decode
  attention is the roofline max of those FLOPs and the K/V bytes (Kwon et al. 2023, Sec. 2);
- TP all-reduces twice per layer (Shoeybi et al. 2019), NCCL's latency-bound tree for the small
  messages of decode (allreduce_base + allreduce_step * log2 tp) plus the bytes at ring bus
  bandwidth; with expert parallelism the MLP's all-reduce becomes a dispatch and a combine
  all-to-all of the routed tokens (Lepikhin et al. 2020, GShard);
- a fixed cost per kernel, and the LM head over the sequences that emit a token.
Where the chip's measured tables reach, they replace these models: the dense GEMMs
(serving_gemm), the routed experts as the fused MoE kernel with the busiest rank's load and
the expert all-to-alls (serving_moe), the TP all-reduces (the engines' own or NCCL's).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autoconfig.cost import comm, kernel_time, serving_gemm, serving_moe, serving_overheads
from autoconfig.cost.inference import ServeInputs, kv_bytes_per_token, measured_all_reduce
from autoconfig.cost.inputs import Col
from autoconfig.cost.layer import head_ops, layer_ops


@dataclass(frozen=True)
class StepModel:
    """Seconds of one iteration on the busiest stage of each deployment (N rows). GEMM terms
    are [G, N] (one row per GEMM of the layer, already times the stage's layers)."""

    gemm_flop_s: Col  # compute seconds per token
    gemm_weight_s: Col  # seconds to stream the weights once
    gemm_act_s: Col  # activation traffic seconds per token
    routed: np.ndarray  # [G] bool: weights read in the share of experts touched
    experts: Col
    topk_share: Col  # k/E: the chance one token picks a given expert
    token_s: Col  # memory-bound ops (norms, activation, residuals, rope) per token
    pair_s: Col  # attention FLOPs per (query, key) pair
    kv_read_s: Col  # reading one cached token's K and V
    fixed_s: Col  # kernel costs and all-reduce latencies per iteration
    comm_token_s: Col  # all-reduce / all-to-all bytes per token
    head_flop_s: Col  # LM head per emitting sequence (compute)
    head_act_s: Col
    head_weight_s: Col
    pp: Col
    hop_fixed_s: Col  # pipeline hand-off per micro-batch
    hop_token_s: Col
    # Deployments whose dense GEMMs the measured tables time (serving_gemm), and those GEMMs'
    # seconds at serving_gemm.TOKEN_GRID token counts, [T, N].
    measured_rows: np.ndarray
    dense_curve: np.ndarray
    # Deployments whose TP all-reduces the measured tables time (the engine's own kernels or
    # NCCL's, one node), and those all-reduces' seconds at the same token counts, [T, N].
    comm_rows: np.ndarray
    comm_curve: np.ndarray
    # Deployments whose routed experts the fused-MoE table times (serving_moe), and their
    # seconds at the same token counts, [T, N]: the routed GEMMs' roofline is dropped there.
    moe_rows: np.ndarray
    moe_curve: np.ndarray
    head_curve: np.ndarray  # the LM head's GEMM by emitting sequences, on measured_rows
    # Host time to launch an iteration's kernels one by one (0 where not measured), and the
    # CUDA graphs that spare it: the largest iteration captured, whether with prefill tokens.
    launch_s: Col
    iteration_s: Col  # the engine's host work per iteration
    sequence_s: Col  # ... and per running sequence
    graph_tokens: Col
    graph_prefill: Col

    def stage(
        self,
        tokens: Col,
        prefill_pairs: Col,
        prefill_kv: Col,
        decode_context: Col,
        sequences: Col,
    ) -> Col:
        """One stage's seconds for an iteration of `tokens` tokens (prefill chunk tokens plus
        one per decoding sequence), `prefill_pairs` causal (query, key) pairs of the chunks,
        `prefill_kv` cached tokens the chunks read, `decode_context` summed context of the
        decoding sequences and `sequences` emitting a token."""
        t = np.asarray(tokens, dtype=float)
        weights = self.gemm_weight_s
        if self.routed.any() and (self.experts > 0).any():
            share = self._expert_share(t)
            weights = weights * np.where(self.routed[:, None], share, 1.0)
        roofline = np.maximum(self.gemm_flop_s * t, weights + self.gemm_act_s * t)
        if self.measured_rows.any() or self.moe_rows.any():
            by_table = np.where(
                self.routed[:, None], self.moe_rows[None, :], self.measured_rows[None, :]
            )
            gemms = np.where(by_table, 0.0, roofline).sum(axis=0)
            if self.measured_rows.any():
                gemms = gemms + np.where(
                    self.measured_rows, serving_gemm.on_curve(self.dense_curve, t), 0.0
                )
            if self.moe_rows.any():
                gemms = gemms + np.where(
                    self.moe_rows, serving_gemm.on_curve(self.moe_curve, t), 0.0
                )
        else:
            gemms = roofline.sum(axis=0)
        if self.comm_rows.any():
            gemms = gemms + np.where(self.comm_rows, serving_gemm.on_curve(self.comm_curve, t), 0.0)
        attention = np.maximum(prefill_pairs * self.pair_s, prefill_kv * self.kv_read_s)
        attention = attention + decode_context * np.maximum(self.pair_s, self.kv_read_s)
        head = np.maximum(
            self.head_flop_s * sequences, self.head_weight_s + self.head_act_s * sequences
        )
        if self.measured_rows.any():
            by_table = serving_gemm.on_curve(self.head_curve, sequences)
            head = np.where(self.measured_rows, by_table, head)
        busy = (t > 0) | (sequences > 0)
        work = gemms + attention + head + (self.token_s + self.comm_token_s) * t + self.fixed_s
        # Outside a CUDA graph the host launches every kernel: the GPU waits for it when its own
        # work is shorter (small batches), and hides it when longer. Before launching, the host
        # schedules the iteration (the engine's work per iteration and per sequence).
        prefilling = (np.asarray(prefill_pairs) > 0) | (np.asarray(prefill_kv) > 0)
        captured = (t <= self.graph_tokens) & (~prefilling | (self.graph_prefill > 0))
        work = np.where(captured, work, np.maximum(work, self.launch_s))
        work = work + self.iteration_s + self.sequence_s * sequences
        return np.where(busy, work, 0.0)

    def hop(self, tokens: Col) -> Col:
        """Hand-off of one micro-batch's activations to the next stage."""
        return np.where(self.pp > 1, self.hop_fixed_s + self.hop_token_s * tokens, 0.0)

    def _expert_share(self, tokens: Col) -> Col:
        """Fraction of the MLP weights an iteration of `tokens` tokens reads."""
        # always-on (shared) experts are their own GEMMs, read whole like any dense weight
        share = 1.0 - np.power(1.0 - self.topk_share, np.maximum(tokens, 0.0))
        return np.where(self.experts > 0, np.minimum(share, 1.0), 1.0)


def step_model(s: ServeInputs) -> StepModel:
    """The coefficients of every deployment in `s` (its batch and lengths are not used)."""
    x = s.x
    ops = layer_ops(x)
    layers = np.ceil(x.layers / x.pp)
    n = x.n
    bandwidth = x.hbm_bytes_s * s.eff_memory
    peak = x.peak_flops * s.eff_gemm
    gemms = [op for op in ops if op.kind == "gemm"]

    def per_gemm(value: object) -> Col:
        return np.broadcast_to(np.asarray(value, dtype=float), (n,)) * layers

    weight_scale = s.weight_bytes / 2.0  # op.weight_bytes counts 16-bit weights
    flop_s = np.stack([per_gemm(op.flops / peak) for op in gemms])
    weight_s = np.stack([per_gemm(op.weight_bytes * weight_scale / bandwidth) for op in gemms])
    act_s = np.stack([per_gemm(s.act_bytes * op.activation_width / bandwidth) for op in gemms])
    routed = np.array([op.routed for op in gemms])  # the expert GEMMs tokens are routed to

    moved = sum((op.moved for op in ops if op.kind == "memory"), start=np.float64(0.0))
    token_s = layers * moved / bandwidth
    attention = next(op for op in ops if op.kind == "attention")
    # op.flops is per token at the training sequence length: 4 * s * q_width / tp.
    pair_flops = attention.flops / np.maximum(x.seq, 1.0)
    attn_peak = x.peak_bf16_flops * np.where(x.flash > 0, x.eff_attention, s.eff_gemm)
    pair_s = layers * pair_flops / attn_peak
    # Prefill attention from the chip's measured flash-attention table where it has one (the
    # engines' kernels, as measured): prompts of the input length, as many of them as fill the
    # token budget, times the rank's query heads working in parallel.
    head_dim = x.head_dim + np.where(x.kv_lora > 0, x.rope_dim, 0.0)
    prompts = np.maximum(s.max_tokens / np.maximum(x.seq, 1.0), 1.0)
    measured_attention = (
        kernel_time.attention_efficiency(
            x.kernels, x.kernel_chip, head_dim, x.seq, prompts * x.heads / x.tp, in_training=False
        )
        if x.kernels
        else None
    )
    if measured_attention is not None:
        by_table = (x.flash > 0) & np.isfinite(measured_attention)
        rate = x.peak_bf16_flops * np.where(by_table, measured_attention, 1.0)
        pair_s = np.where(by_table, layers * pair_flops / rate, pair_s)
    kv_read_s = kv_bytes_per_token(s, layers) / bandwidth

    tree = s.ar_base_s + s.ar_step_s * np.log2(np.maximum(x.tp, 1.0))
    link = comm.tp_link(x)
    ring = 2.0 * (x.tp - 1.0) / np.maximum(x.tp, 1.0) * 2.0 * x.hidden / link.bandwidth
    expert_parallel = (s.ep > 1) & (x.experts > 0)
    # With EP the MLP's all-reduce becomes dispatch + combine all-to-alls of k copies of each
    # token, each rank sending (n-1)/n of them.
    a2a = 2.0 * (x.tp - 1.0) / np.maximum(x.tp, 1.0) * x.topk * s.act_bytes * x.hidden
    a2a_s = a2a / link.bandwidth
    per_layer_token = np.where(expert_parallel, ring / 2.0 + a2a_s, ring)
    tp_on = x.tp > 1
    comm_rows, comm_curve = _measured_all_reduces(s, layers, expert_parallel, n)
    # Where the tables time the all-reduces, only the expert all-to-alls stay per token.
    per_layer_token = np.where(comm_rows, np.where(expert_parallel, a2a_s, 0.0), per_layer_token)
    # ... and where the NCCL table times the all-to-alls too (one node), nothing does.
    a2a_rows, a2a_curve = _measured_all_to_alls(s, layers, expert_parallel, n)
    per_layer_token = np.where(comm_rows & a2a_rows, 0.0, per_layer_token)
    comm_curve = comm_curve + np.where(comm_rows & a2a_rows, a2a_curve, 0.0)
    comm_token_s = np.where(tp_on, layers * per_layer_token, 0.0)
    head = next(op for op in head_ops(x) if op.name == "lm_head")
    head_flop_s = np.broadcast_to(head.flops / peak, (n,))
    # The LM head stays 16-bit in fp8 / fp4 checkpoints (ModelOpt keeps lm_head unquantised).
    head_weight_s = np.broadcast_to(head.weight_bytes / bandwidth, (n,))
    head_act_s = np.broadcast_to(2.0 * (head.gemm_k + head.gemm_n) / bandwidth, (n,))
    pp_link = comm.pp_link(x)
    experts = np.maximum(x.experts, 1.0)
    rows = np.broadcast_to(serving_gemm.applies(x, s.weight_bytes, s.act_bytes), (n,))
    curve = serving_gemm.token_curve(x, ops, layers, rows, s.weight_bytes) if rows.any() else None
    head_curve = serving_gemm.token_curve(x, [head], 1.0, rows) if curve is not None else None
    if curve is None or head_curve is None:
        rows, curve = np.zeros(n, bool), np.zeros((len(serving_gemm.TOKEN_GRID), n))
        head_curve = curve
    moe_rows, moe_curve = serving_moe.token_curve(x, layers, s.ep, s.weight_bytes, s.act_bytes, n)
    gathered, logits = _measured_logits_gather(s, rows, n)
    head_curve = head_curve + logits
    fixed_s, launch_s = _fixed_costs(s, ops, layers, tree, comm_rows, gathered, n)
    return StepModel(
        gemm_flop_s=flop_s,
        gemm_weight_s=weight_s,
        gemm_act_s=act_s,
        routed=routed,
        experts=np.broadcast_to(x.experts, (n,)).astype(float),
        topk_share=np.broadcast_to(np.minimum(x.topk / experts, 1.0), (n,)),
        token_s=np.broadcast_to(token_s, (n,)),
        pair_s=np.broadcast_to(pair_s, (n,)),
        kv_read_s=np.broadcast_to(kv_read_s, (n,)),
        fixed_s=np.broadcast_to(fixed_s, (n,)),
        comm_token_s=np.broadcast_to(comm_token_s, (n,)),
        head_flop_s=head_flop_s,
        head_act_s=head_act_s,
        head_weight_s=head_weight_s,
        pp=np.broadcast_to(x.pp, (n,)).astype(float),
        hop_fixed_s=np.broadcast_to(pp_link.latency, (n,)),
        hop_token_s=np.broadcast_to(s.act_bytes * x.hidden / x.tp / pp_link.bandwidth, (n,)),
        measured_rows=np.asarray(rows, bool),
        dense_curve=curve,
        comm_rows=comm_rows,
        comm_curve=comm_curve,
        moe_rows=moe_rows,
        moe_curve=moe_curve,
        head_curve=head_curve,
        launch_s=np.broadcast_to(launch_s, (n,)),
        iteration_s=np.broadcast_to(s.iteration_s, (n,)).astype(float),
        sequence_s=np.broadcast_to(s.sequence_s, (n,)).astype(float),
        graph_tokens=np.broadcast_to(s.graph_tokens, (n,)).astype(float),
        graph_prefill=np.broadcast_to(s.graph_prefill, (n,)).astype(float),
    )


def _measured_logits_gather(s: ServeInputs, rows: np.ndarray, n: int) -> tuple[np.ndarray, Col]:
    """Rows whose logits' all-gather over the TP ranks the tables time (half an all-reduce of
    the same buffer), and its seconds at serving_gemm.TOKEN_GRID emitting sequences, [T, N]."""
    x = s.x
    none = np.zeros(n, bool), np.zeros((len(serving_gemm.TOKEN_GRID), n))
    if not rows.any() or not np.any(x.tp > 1):
        return none
    seconds = [
        measured_all_reduce(s, np.full(n, 2.0 * seqs) * x.vocab) for seqs in serving_gemm.TOKEN_GRID
    ]
    if any(t is None for t in seconds):
        return none
    logits = np.stack([np.broadcast_to(t, (n,)) for t in seconds if t is not None]) / 2.0
    gathered = rows & (np.broadcast_to(x.tp, (n,)) > 1) & np.isfinite(logits).all(axis=0)
    return gathered, np.where(gathered, logits, 0.0)


def _fixed_costs(
    s: ServeInputs,
    ops: list,
    layers: Col,
    tree: Col,
    comm_rows: np.ndarray,
    gathered: np.ndarray,
    n: int,
) -> tuple[Col, Col]:
    """Per iteration, (the GPU's fixed seconds, the host's seconds to launch every kernel):
    each kernel's cost beyond its work (serving_overheads) and the modelled tree latency of
    the all-reduces the tables do not time."""
    x = s.x
    tp_on = x.tp > 1
    layer_kernels, head_kernels = serving_overheads.kernel_costs(s, ops, n)
    tree_s = np.where(tp_on & ~comm_rows, 2.0 * tree, 0.0)
    gather_s = np.where(tp_on & ~gathered, tree, 0.0)
    fixed = layers * (layer_kernels + tree_s) + gather_s + head_kernels
    return fixed, serving_overheads.launch_seconds(s, ops, layers, n)


def _measured_all_reduces(
    s: ServeInputs, layers: Col, expert_parallel: Col, n: int
) -> tuple[np.ndarray, np.ndarray]:
    """Rows whose TP all-reduces the measured tables time at every token count, and their
    seconds per iteration at serving_gemm.TOKEN_GRID tokens, [T, N]: two a layer (after
    attention and after the MLP; one with expert parallelism, whose MLP exchanges tokens by
    all-to-all instead) of the 16-bit activations."""
    x = s.x
    curve = np.zeros((len(serving_gemm.TOKEN_GRID), n))
    if not np.any(x.tp > 1):
        return np.zeros(n, bool), curve
    per_layer = np.where(expert_parallel, 1.0, 2.0) * np.broadcast_to(layers, (n,))
    for j, tokens in enumerate(serving_gemm.TOKEN_GRID):
        seconds = measured_all_reduce(s, np.full(n, 2.0 * tokens) * x.hidden)
        if seconds is None:
            return np.zeros(n, bool), curve
        curve[j] = per_layer * np.broadcast_to(seconds, (n,))
    rows = (np.broadcast_to(x.tp, (n,)) > 1) & np.isfinite(curve).all(axis=0)
    return rows, np.where(rows, curve, 0.0)


def _measured_all_to_alls(
    s: ServeInputs, layers: Col, expert_parallel: Col, n: int
) -> tuple[np.ndarray, np.ndarray]:
    """Rows whose expert-parallel dispatch and combine the NCCL table times (ep ranks within
    the measured ones), and their seconds per iteration at serving_gemm.TOKEN_GRID tokens,
    [T, N]; rows without expert parallelism have none to time (true, 0)."""
    x = s.x
    curve = np.zeros((len(serving_gemm.TOKEN_GRID), n))
    ep = np.where(expert_parallel, np.broadcast_to(np.asarray(s.ep, float), (n,)), 1.0)
    if not np.any(expert_parallel):
        return np.ones(n, bool), curve
    for j, tokens in enumerate(serving_gemm.TOKEN_GRID):
        seconds = serving_moe.all_to_all_seconds(x, np.full(n, tokens), ep, s.act_bytes)
        if seconds is None:
            return ~np.broadcast_to(np.asarray(expert_parallel, bool), (n,)), curve
        curve[j] = np.broadcast_to(seconds, (n,)) * np.broadcast_to(layers, (n,))
    rows = np.asarray(np.isfinite(curve).all(axis=0), bool)
    return rows, np.where(rows, curve, 0.0)


def take(model: StepModel, rows: np.ndarray) -> StepModel:
    """The coefficients of the deployments at `rows` (a simulation of a subset)."""
    picked = {}
    for name in model.__dataclass_fields__:
        value = getattr(model, name)
        if name == "routed":
            picked[name] = value
        elif name in ("measured_rows", "comm_rows", "moe_rows"):
            picked[name] = np.asarray(value)[rows]
        elif np.ndim(value) == 2:
            picked[name] = value[:, rows]
        else:
            picked[name] = np.asarray(value)[rows]
    return StepModel(**picked)
