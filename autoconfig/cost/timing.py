"""Step time: per-op roofline compute, exposed communication and the pipeline schedule.

- Each GEMM takes max(FLOPs / (peak * gemm efficiency), bytes / (HBM * memory efficiency))
  plus a fixed per-kernel cost (roofline, Williams et al. 2009); memory-bound ops take bytes
  moved / effective bandwidth; backward is 2x forward (2.5x for flash attention, whose
  backward recomputes the scores: Dao 2023, FlashAttention-2, Sec. 3.1.2). Causal flash
  attention skips the masked half of the score blocks.
- TP: 2 all-reduces (or all-gather + reduce-scatter with SP) of the layer's b*s*h activations
  in forward and 2 in backward (Shoeybi et al. 2019, Megatron-LM, Sec. 3; Korthikanti et al.
  2022, Sec. 4.2.2), exposed; recomputed forwards repeat them.
- PP: 1F1B and interleaved 1F1B take (m*v + p - 1) slots of one chunk's forward+backward;
  the bubble is (p-1)/(v*m) of the ideal time (Narayanan et al. 2021, "Efficient Large-Scale
  Language Model Training on GPU Clusters", Sec. 2.2). Each slot also sends one activation
  forward and one gradient back.
- DP: gradients are reduced during the last micro-batch's backward (overlap), ZeRO-1/2
  all-gather updated weights during the next forward; ZeRO-3 gathers weights for every
  micro-batch's forward and backward and reduce-scatters gradients each time (Rajbhandari et
  al. 2020; Zhao et al. 2023, "PyTorch FSDP").
- CP: ring attention passes K/V blocks cp-1 times (K/V and their gradients in backward),
  hidden behind the block attention compute when it is longer (Liu et al. 2023, "Ring
  Attention"). EP: all-to-all dispatch and combine, forward and backward (Lepikhin et al.
  2020, GShard), exposed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autoconfig.cost import comm
from autoconfig.cost.inputs import (
    OP_LEVEL,
    SELECTIVE,
    Col,
    CostInputs,
    recomputed_layers,
    stage_layers,
)
from autoconfig.cost.layer import Op, embedding_ops, head_ops, layer_ops
from autoconfig.cost.memory import StageParams, stage_params


def _op_time(x: CostInputs, op: Op, tokens: Col) -> Col:
    """Forward GPU time of one op over `tokens` tokens on one rank."""
    if op.kind == "gemm":
        act = np.where(x.fp8 > 0, 1.0, 2.0)
        traffic = act * tokens * (op.gemm_k + op.gemm_n) + op.weight_bytes
        compute = op.flops * tokens / (x.peak_flops * x.eff_gemm)
        return np.maximum(compute, traffic / (x.hbm_bytes_s * x.eff_memory))
    if op.kind == "attention":
        causal = np.where(x.flash > 0, 0.5, 1.0)
        eff = np.where(x.flash > 0, x.eff_attention, x.eff_gemm)
        return op.flops * tokens * causal / (x.peak_bf16_flops * eff)
    return op.moved * tokens / (x.hbm_bytes_s * x.eff_memory)


def kernel_count(ops: list[Op]) -> Col:
    """Forward kernel launches of the ops that exist for each candidate."""
    out: Col | float = 0.0
    for op in ops:
        present = (np.asarray(op.flops) + np.asarray(op.moved) + np.asarray(op.saved)) > 0
        out = out + np.where(present, op.kernels, 0.0)
    return np.asarray(out)


def _fwd_bwd(x: CostInputs, ops: list[Op], tokens: Col) -> tuple[Col, Col]:
    fwd = bwd = 0.0
    for op in ops:
        t = _op_time(x, op, tokens)
        fwd = fwd + t
        bwd = bwd + op.bwd_factor * t
    return np.asarray(fwd), np.asarray(bwd)


@dataclass(frozen=True)
class StepTime:
    """Seconds per optimizer step by part; they add up to `total`."""

    compute: Col  # forward + backward + recompute of all micro-batches (slowest stage)
    launch: Col  # time the host's kernel launches add beyond the GPU's work
    tp_comm: Col
    cp_comm: Col
    ep_comm: Col
    pp_comm: Col
    bubble: Col
    dp_comm: Col
    optimizer: Col
    layer_fwd: Col  # one layer, one micro-batch (for slice-mode checks)
    layer_bwd: Col

    @property
    def total(self) -> Col:
        return (
            self.compute
            + self.launch
            + self.tp_comm
            + self.cp_comm
            + self.ep_comm
            + self.pp_comm
            + self.bubble
            + self.dp_comm
            + self.optimizer
        )


def step_time(
    x: CostInputs, ops: list[Op] | None = None, params: StageParams | None = None
) -> StepTime:
    tokens = x.mbs * x.seq / x.cp
    m = x.gbs / (x.dp * x.mbs)
    per_stage = stage_layers(x)
    ops = ops if ops is not None else layer_ops(x)
    params = params if params is not None else stage_params(x)
    f_gpu, b_gpu = _fwd_bwd(x, ops, tokens)
    # Tensor parallel: 2 collectives of b*s*h per layer in forward, 2 in backward.
    act_bytes = 2.0 * tokens * x.hidden
    tp_one = comm.all_reduce(act_bytes, x.tp, comm.tp_link(x))
    tp_collectives = np.where(x.tp > 1, 2.0, 0.0)
    # The host launches kernels asynchronously: a layer takes the longer of its GPU time and
    # the time to launch its kernels (eager frameworks turn launch-bound at small per-rank
    # work, e.g. small micro-batches with wide TP).
    launch_f = (kernel_count(ops) + tp_collectives) * x.kernel_s
    f_busy, b_busy = f_gpu + 2.0 * tp_one, b_gpu + 2.0 * tp_one
    f_layer = np.maximum(f_busy, launch_f)
    b_layer = np.maximum(b_busy, 2.0 * launch_f)
    launch_excess = (f_layer - f_busy) + (b_layer - b_busy)
    recompute_ops = [op for op in ops if op.dropped_by_selective or op.kind == "attention"]
    f_attn, _ = _fwd_bwd(x, recompute_ops, tokens)
    f_attn = np.maximum(f_attn, kernel_count(recompute_ops) * x.kernel_s)
    recomputed = recomputed_layers(x, per_stage)
    # Op-level SAC re-runs every memory-bound op and half of the matmuls.
    f_cheap, _ = _fwd_bwd(x, [op for op in ops if op.kind == "memory"], tokens)
    f_mm, _ = _fwd_bwd(x, [op for op in ops if op.kind == "gemm"], tokens)
    extra_fwd = recomputed * f_layer + per_stage * np.select(
        [x.recompute == SELECTIVE, x.recompute == OP_LEVEL], [f_attn, f_cheap + 0.5 * f_mm], 0.0
    )

    f_emb, b_emb = _fwd_bwd(x, embedding_ops(x), tokens)
    f_head, b_head = _fwd_bwd(x, head_ops(x), tokens)
    single = x.pp == 1
    ends = f_emb + b_emb + f_head + b_head
    stage_fwd = per_stage * f_layer + np.where(single, f_emb + f_head, f_head)
    stage_compute = _busiest_stage(
        x,
        per_stage,
        f_layer + b_layer + extra_fwd / per_stage,
        ends,
        np.where(single, ends, f_head + b_head),
    )

    # TP time inside the layer times above, broken out for the report; the embedding and the
    # vocab-parallel cross-entropy add two more reduces.
    tp_per_mb = tp_one * (4.0 * per_stage + 2.0 * recomputed + 2.0)

    # Context parallel: K and V blocks (and their gradients) travel cp-1 hops per layer.
    kv_bytes = 2.0 * 2.0 * tokens * x.kv_heads * x.head_dim / x.tp
    hop = comm.p2p(kv_bytes, comm.cp_link(x))
    attn_op = next(op for op in ops if op.kind == "attention")
    attn_f = _op_time(x, attn_op, tokens)
    blocks = np.maximum(x.cp, 1.0)
    cp_f = (x.cp - 1.0) * np.maximum(hop - attn_f / blocks, 0.0)
    cp_b = (x.cp - 1.0) * np.maximum(2.0 * hop - 2.5 * attn_f / blocks, 0.0)
    cp_per_mb = np.where(x.cp > 1, per_stage * (cp_f + cp_b), 0.0)

    # Expert parallel: dispatch + combine in forward and backward for every MoE layer.
    moe_bytes = 2.0 * tokens * x.topk * x.hidden
    ep_one = comm.all_to_all(moe_bytes, x.ep, comm.ep_link(x))
    ep_per_mb = np.where(x.experts > 0, 4.0 * per_stage * ep_one, 0.0)

    # stage_compute already holds the layers' TP and launch time: report them apart.
    launch_per_mb = per_stage * launch_excess
    stage_compute = stage_compute + 2.0 * tp_one
    slot = stage_compute + cp_per_mb + ep_per_mb  # one micro-batch, whole stage
    pure_compute = stage_compute - tp_per_mb - launch_per_mb
    bubble = (x.pp - 1.0) * slot / x.vp
    p2p_bytes = 2.0 * tokens * x.hidden / np.where(x.sp > 0, x.tp, 1.0)
    p2p_one = comm.p2p(p2p_bytes, comm.pp_link(x))
    pp_comm = np.where(x.pp > 1, (m * x.vp + x.pp - 1.0) * 2.0 * p2p_one, 0.0)

    dp_comm, optimizer = _data_parallel(x, params, m, per_stage, f_layer, b_layer, stage_fwd)
    optimizer = optimizer + x.step_overhead_s
    return StepTime(
        compute=m * pure_compute,
        launch=m * launch_per_mb,
        tp_comm=m * tp_per_mb,
        cp_comm=m * cp_per_mb,
        ep_comm=m * ep_per_mb,
        pp_comm=pp_comm,
        bubble=bubble,
        dp_comm=dp_comm,
        optimizer=optimizer,
        layer_fwd=f_layer,
        layer_bwd=b_layer,
    )


def _busiest_stage(x: CostInputs, per_stage: Col, layer: Col, ends: Col, last_extra: Col) -> Col:
    """Compute time per micro-batch of the slowest pipeline rank.

    An even split puts layers/pp layers on every rank plus the LM head (and loss) on the last.
    Frameworks can instead balance the head against layers (nanotron assigns blocks by
    compute cost; Megatron-LM has --account-for-loss-in-pipeline-split and
    --decoder-last-pipeline-num-layers), so the busiest rank is the better of the two: the
    even split, or whole layers summing to the balanced share of the total.
    """
    even = per_stage * layer + last_extra
    balanced = np.ceil((x.layers * layer + ends) / (x.pp * layer) - 1e-9) * layer
    return np.where(x.pp > 1, np.minimum(even, np.maximum(balanced, ends)), even)


def _data_parallel(
    x: CostInputs,
    p: StageParams,
    m: Col,
    per_stage: Col,
    f_layer: Col,
    b_layer: Col,
    stage_fwd: Col,
) -> tuple[Col, Col]:
    """Exposed gradient/weight communication and the optimizer step, per step."""
    params = np.maximum(p.dense_first, p.dense_last) + p.expert
    size = x.dp * x.cp
    link = comm.dp_link(x)
    grads = 4.0 * params  # fp32 gradient reduction (Megatron main_grad, FSDP reduce_dtype)
    window_b = np.where(x.overlap_grad_reduce > 0, per_stage * b_layer, 0.0)
    window_f = np.where(x.overlap_grad_reduce > 0, stage_fwd, 0.0)
    ar = comm.all_reduce(grads, size, link)
    rs = comm.reduce_scatter(grads, size, link)
    ag = comm.all_gather(2.0 * params, size, link)
    zero0 = np.maximum(ar - window_b, 0.0)
    zero12 = np.maximum(rs - window_b, 0.0) + np.maximum(ag - window_f, 0.0)
    # ZeRO-3: every micro-batch gathers weights twice and reduce-scatters gradients; the
    # first layer's gather cannot hide behind anything.
    per_mb = np.maximum(ag - per_stage * f_layer, 0.0) + np.maximum(
        ag + rs - per_stage * b_layer, 0.0
    )
    zero3 = m * per_mb + ag / np.maximum(per_stage, 1.0)
    dp_comm = np.select([x.zero >= 3, x.zero >= 1], [zero3, zero12], zero0)
    dp_comm = np.where(size > 1, dp_comm, 0.0)
    # Adam reads grads + fp32 states and writes states + 16-bit weights: ~30 bytes/param
    # on this rank's optimizer shard.
    shard = np.where(x.zero >= 1, size, 1.0)
    optimizer = 30.0 * params / shard / (x.hbm_bytes_s * x.eff_memory)
    return dp_comm, optimizer
