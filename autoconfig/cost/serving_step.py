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
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autoconfig.cost import comm
from autoconfig.cost.inference import ServeInputs, kv_bytes_per_token
from autoconfig.cost.inputs import Col
from autoconfig.cost.layer import head_ops, layer_ops
from autoconfig.cost.timing import kernel_count


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
        gemms = np.maximum(self.gemm_flop_s * t, weights + self.gemm_act_s * t).sum(axis=0)
        attention = np.maximum(prefill_pairs * self.pair_s, prefill_kv * self.kv_read_s)
        attention = attention + decode_context * np.maximum(self.pair_s, self.kv_read_s)
        head = np.maximum(
            self.head_flop_s * sequences, self.head_weight_s + self.head_act_s * sequences
        )
        busy = (t > 0) | (sequences > 0)
        work = gemms + attention + head + (self.token_s + self.comm_token_s) * t + self.fixed_s
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
    comm_token_s = np.where(tp_on, layers * per_layer_token, 0.0)
    kernels = kernel_count(ops) + np.where(tp_on, 2.0, 0.0)
    fixed_s = layers * (kernels * s.kernel_s + np.where(tp_on, 2.0 * tree, 0.0))

    head = next(op for op in head_ops(x) if op.name == "lm_head")
    head_flop_s = np.broadcast_to(head.flops / peak, (n,))
    # The LM head stays 16-bit in fp8 / fp4 checkpoints (ModelOpt keeps lm_head unquantised).
    head_weight_s = np.broadcast_to(head.weight_bytes / bandwidth, (n,))
    head_act_s = np.broadcast_to(2.0 * (head.gemm_k + head.gemm_n) / bandwidth, (n,))
    gather = np.where(tp_on, tree, 0.0) + 2.0 * s.kernel_s
    pp_link = comm.pp_link(x)
    experts = np.maximum(x.experts, 1.0)
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
        fixed_s=np.broadcast_to(fixed_s + gather, (n,)),
        comm_token_s=np.broadcast_to(comm_token_s, (n,)),
        head_flop_s=head_flop_s,
        head_act_s=head_act_s,
        head_weight_s=head_weight_s,
        pp=np.broadcast_to(x.pp, (n,)).astype(float),
        hop_fixed_s=np.broadcast_to(pp_link.latency, (n,)),
        hop_token_s=np.broadcast_to(s.act_bytes * x.hidden / x.tp / pp_link.bandwidth, (n,)),
    )


def take(model: StepModel, rows: np.ndarray) -> StepModel:
    """The coefficients of the deployments at `rows` (a simulation of a subset)."""
    picked = {}
    for name in model.__dataclass_fields__:
        value = getattr(model, name)
        if name == "routed":
            picked[name] = value
        elif np.ndim(value) == 2:
            picked[name] = value[:, rows]
        else:
            picked[name] = np.asarray(value)[rows]
    return StepModel(**picked)
