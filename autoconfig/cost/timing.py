"""Step time: per-op roofline compute, exposed communication and the pipeline schedule.

- GEMMs, flash attention and collectives inside one NVLink domain come from the measured
  kernel tables of the candidate's GPU (cost.kernel_time; docs/model.md): a GEMM's forward,
  input-gradient and weight-gradient shapes are each looked up, flash attention's backward is
  a measured multiple of its forward. Sub-16-bit GEMMs also pay Transformer Engine's
  quantization passes (row-wise and transposed copies of the input, and of the output
  gradient in backward). A GPU without tables takes max(FLOPs / (peak * gemm efficiency),
  bytes / (HBM * memory efficiency)) plus a per-kernel cost (roofline, Williams et al.
  2009), backward 2x the forward (2.5x for flash attention: Dao 2023, FlashAttention-2,
  Sec. 3.1.2). Causal flash attention skips the masked half of the score blocks;
  memory-bound ops take bytes moved / effective bandwidth.
- TP: per block with TP-split matmuls one all-reduce (or all-gather + reduce-scatter with SP)
  of the block's b*s*h activations in forward and one in backward (Shoeybi et al. 2019,
  Megatron-LM, Sec. 3; Korthikanti et al. 2022, Sec. 4.2.2); recomputed forwards repeat them.
  With TP communication overlap (Megatron-Core `--tp-comm-overlap`, torchtitan async TP) a
  collective hides behind the GEMM it feeds; only what exceeds that GEMM stays exposed.
- PP: 1F1B and interleaved 1F1B take (m*v + p - 1) slots of one chunk's forward+backward;
  the bubble is (p-1)/(v*m) of the ideal time (Narayanan et al. 2021, "Efficient Large-Scale
  Language Model Training on GPU Clusters", Sec. 2.2). Each slot also sends one activation
  forward and one gradient back, exposed unless the framework overlaps P2P with compute.
- DP: gradients are reduced during the last micro-batch's backward (overlap), or during every
  micro-batch's where the framework does so (FSDP's reduce-scatter, DeepSpeed's ZeRO-2), or
  after the whole backward, hidden by none of it, where the framework starts it there
  (torch.distributed.pipelining's FSDP stages, DeepSpeed's pipeline engine);
  ZeRO-1/2 all-gather updated weights during the next forward (when the framework overlaps it);
  ZeRO-3 gathers each layer's weights before its forward and its backward and
  reduce-scatters its gradients after, prefetching one layer ahead, so per layer only what
  exceeds that layer's compute is exposed (Rajbhandari et al. 2020; Zhao et al. 2023,
  "PyTorch FSDP", Sec. 3.3-3.4).
- CP: ring attention passes K/V blocks cp-1 times (K/V and their gradients in backward),
  hidden behind the block attention compute when it is longer (Liu et al. 2023, "Ring
  Attention"). EP: all-to-all dispatch and combine, forward and backward (Lepikhin et al.
  2020, GShard), exposed.
- Multi-token prediction adds its block and a second LM head to the last pipeline stage.
- LoRA and QLoRA (cost.finetune): a frozen GEMM's backward is its input gradient alone;
  data parallelism reduces (and ZeRO-1/2 gathers back) only the adapters, while ZeRO-3 and
  FSDP still gather every weight; the optimizer updates only the adapters.
- Gradient accumulation: a framework that does not add each micro-batch's weight gradients
  inside the GEMM (as Megatron's gradient_accumulation_fusion does into fp32 main_grad) makes
  memory-bound passes over them every micro-batch: nanotron adds bf16 gradients into fp32
  buffers, torch autograd under autocast casts them to fp32 and adds them to `.grad`.
  torch's fully_shard also copies on the compute stream around its collectives (each gather
  out into the weights, each reduction's gradients into the reduce-scatter input).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from autoconfig.cost import activation_offload, comm, finetune, kernel_time, offload
from autoconfig.cost.inputs import (
    OP_LEVEL,
    SELECTIVE,
    Col,
    CostInputs,
    counts_ends,
    even_split_layers,
    last_stage_layers,
    recomputed_layers,
    splits_by_cost,
    stage_layers,
)
from autoconfig.cost.layer import (
    ZERO,
    Op,
    attended_length,
    attention_widths,
    embedding_ops,
    head_ops,
    layer_ops,
    mtp_ops,
)
from autoconfig.cost.memory import StageParams, saved_activations, stage_params
from autoconfig.cost.optimizer import state_bytes as optimizer_state_bytes

# The output tile of one thread block in cuBLAS's large bf16 GEMM kernels on Ampere and Hopper
# (256 x 128, the tile size their kernel names carry, M x N in cuBLAS's column-major terms: for
# a linear layer M is the output features and N the tokens).
TILE_TOKENS = 128.0
TILE_N = 256.0


def wave_utilization(tokens: Col, n: Col, sms: Col) -> Col:
    """Share of SM slots a GEMM of `tokens` x `n` outputs fills over its waves: its output tiles
    run one per SM at a time, so it takes ceil(tiles / sms) waves, and the last one runs partly
    empty (tiles / (waves x sms)). A micro-batch of few tokens under wide tensor parallelism
    makes fewer tiles than the GPU has SMs (4,096 tokens by 256 outputs is 32 tiles for H100's
    132 SMs). cuBLAS picks smaller tiles or splits K for such shapes, so for very small ones
    this is an upper bound of the loss. 1 where `sms` is 0 (not modelled)."""
    tiles = np.ceil(tokens / TILE_TOKENS) * np.ceil(np.maximum(n, 1.0) / TILE_N)
    full = np.ceil(tiles / np.maximum(sms, 1.0)) * np.maximum(sms, 1.0)
    return np.where(sms > 0, tiles / full, 1.0)


def _op_time(x: CostInputs, op: Op, tokens: Col) -> Col:
    """Forward GPU time of one op over `tokens` tokens on one rank."""
    return _op_times(x, op, tokens)[0]


def _op_times(x: CostInputs, op: Op, tokens: Col) -> tuple[Col, Col]:
    """Forward and backward GPU time of one op over `tokens` tokens on one rank: GEMMs and
    flash attention from the chip's measured kernels where it has tables, else from the
    profile's efficiency constants (backward `bwd_factor` times the forward)."""
    bandwidth = x.hbm_bytes_s * x.eff_memory
    if op.kind != "memory" and not np.any(op.present):
        # a GEMM or attention no candidate's layer has (a dense model's experts): no time, and
        # no table look-ups, which dominate the search's cost
        return ZERO, ZERO
    if op.kind == "gemm" and op.sixteen_bit and np.any(np.asarray(x.gemm_bytes) < 2.0):
        x = replace(x, gemm_bytes=np.float32(2.0), peak_flops=x.peak_bf16_flops)
    if op.kind == "gemm":
        measured = _measured_gemm(x, op, tokens)
        if measured is not None:
            return measured
        # A GEMM the layer lacks (a dense model's expert, router or latent GEMM keeps its
        # shape but has no FLOPs) moves nothing either (`Op.activation_width`). Charging its
        # traffic, which tensor parallelism does not split, would make wide-TP layouts look
        # slower than they run.
        traffic = x.gemm_bytes * tokens * op.activation_width
        traffic = traffic + op.weight_bytes * x.gemm_bytes / 2.0
        compute = op.flops * tokens / (x.peak_flops * x.eff_gemm)
        # A routed expert's GEMM sees only the tokens routed to it, not `tokens`: its waves
        # are left to the fitted efficiency.
        if not op.routed:
            compute = compute / wave_utilization(tokens, op.tile_width, x.sms)
        gemm = np.maximum(compute, traffic / bandwidth)
        cast_f, cast_b = _quantize_passes(x, op, tokens)
        # a frozen weight needs no weight gradient: backward is the input gradient alone
        bwd_factor = op.bwd_factor - finetune.frozen(x) if finetune.any_frozen(x) else op.bwd_factor
        return gemm + cast_f, bwd_factor * gemm + cast_b
    if op.kind == "attention":
        causal = np.where(x.flash > 0, 0.5, 1.0)
        flops = op.flops * tokens * causal
        eff = np.where(x.flash > 0, x.eff_attention, x.eff_gemm)
        fwd = flops / (x.peak_bf16_flops * eff)
        if op.name == "attention":
            measured = _measured_attention(x, flops, fwd)
            if measured is not None:
                return measured
        return fwd, op.bwd_factor * fwd
    fwd = op.moved * tokens / bandwidth
    return fwd, op.bwd_factor * fwd


def _quantize_passes(x: CostInputs, op: Op, tokens: Col) -> tuple[Col, Col]:
    """The memory-bound passes that quantize a sub-16-bit GEMM's 16-bit operands, forward and
    backward. Transformer Engine's fp8, MXFP8 and NVFP4 recipes read the input in 16 bits and
    write it twice in the GEMM format: the row-wise copy the forward GEMM reads and the
    transposed (column-wise scaled) copy the weight-gradient GEMM reads (its cast_transpose
    on Hopper, both quantization directions on Blackwell); backward does the same for the
    output gradient, which the input- and weight-gradient GEMMs read. The elements come from
    the op's FLOPs (2 k n per row: its rows times k in, times n out), so shares and routed
    copies count as the GEMM does. The weights' quantization, once a step where the
    framework caches it over micro-batches, is not charged."""
    per_element = np.where(x.gemm_bytes < 2.0, 2.0 + 2.0 * x.gemm_bytes, 0.0)
    flops = op.flops * tokens * per_element / (x.hbm_bytes_s * x.eff_memory)
    # a GEMM fused with others (q with k and v) shares one quantized input: its share of it
    inputs = flops / (2.0 * np.maximum(op.tile_width, 1.0))
    output_grads = flops / (2.0 * np.maximum(op.gemm_k, 1.0))
    return inputs, output_grads


def gemm_tokens(x: CostInputs, op: Op, tokens: Col) -> Col:
    """Rows of the GEMM an op runs: the micro-batch's tokens, or for a routed expert the
    tokens one expert receives: a rank's 1/tp share of them, top-k copies each, spread over
    the experts and gathered from the ep ranks (and the etp group) that hold it."""
    if not op.routed:
        return tokens
    per_expert = tokens * x.topk * x.ep * x.etp / (x.tp * np.maximum(x.experts, 1.0))
    return np.maximum(per_expert, 1.0)


def _measured_gemm(x: CostInputs, op: Op, tokens: Col) -> tuple[Col, Col] | None:
    """A GEMM's forward and backward from the chip's measured GEMM table: forward m x k by
    k x n, backward's input gradient m x n by n x k and weight gradient k x m by m x n, each
    looked up at its own shape (m tokens, k the reduction and n the output width per rank, the
    fused kernel's width where the GEMM runs inside one). The table's achieved rate at the
    fused kernel's shape applies to this GEMM's share of its FLOPs. None where no row has a
    table; rows without one (NaN) take the efficiency constants."""
    if not x.kernels:
        return None
    m = gemm_tokens(x, op, tokens)
    n, k = op.tile_width, np.maximum(op.gemm_k, 1.0)
    codes, nbytes = x.kernel_chip, x.gemm_bytes
    forward = kernel_time.gemm_efficiency(x.kernels, codes, nbytes, m, n, k)
    if forward is None:
        return None
    dgrad = kernel_time.gemm_efficiency(x.kernels, codes, nbytes, m, k, n)
    wgrad = kernel_time.gemm_efficiency(x.kernels, codes, nbytes, k, n, m)
    flops = op.flops * tokens
    peak = x.peak_flops
    cast_f, cast_b = _quantize_passes(x, op, tokens)
    fwd = flops / (peak * forward) + cast_f
    wgrad_s = flops / (peak * wgrad)
    if finetune.any_frozen(x):
        # LoRA skips the frozen weights' weight-gradient GEMMs and keeps the input-gradient
        # ones, which carry the gradient down to the adapters of earlier layers (Hu et al.
        # 2021, Sec. 4.2): a step's base GEMMs are about 2/3 of a full step's.
        wgrad_s = (1.0 - finetune.frozen(x)) * wgrad_s
    bwd = flops / (peak * dgrad) + wgrad_s + cast_b
    fallback_f, fallback_b = _fallback_gemm(x, op, tokens, np.isnan(fwd) | np.isnan(bwd))
    return (
        np.where(np.isnan(fwd), fallback_f, np.where(op.present, fwd, 0.0)),
        np.where(np.isnan(bwd), fallback_b, np.where(op.present, bwd, 0.0)),
    )


def _fallback_gemm(x: CostInputs, op: Op, tokens: Col, missing: Col) -> tuple[Col, Col]:
    """A GEMM timed by the profile's efficiency constants, for the rows `missing` a table
    (their chip has none, or their code points past the table set)."""
    if not np.any(missing):
        return np.float64(np.nan), np.float64(np.nan)
    return _op_times(replace(x, kernels=kernel_time.NO_KERNELS), op, tokens)


def _measured_attention(x: CostInputs, flops: Col, modelled: Col) -> tuple[Col, Col] | None:
    """Causal flash attention from the chip's measured forward kernels: its micro-batch's
    sequences (or packed documents) times the rank's heads run in parallel over length/cp
    queries each (ring attention works on cp blocks); backward ATTENTION_BACKWARD_OVER_FORWARD
    times the forward. Rows without a table, or without flash attention, keep the `modelled`
    forward (2.5x backward)."""
    head_dim = x.head_dim + np.where(x.kv_lora > 0, x.rope_dim, 0.0)
    # Packed documents run as seq/length independent (document, head) problems of their own
    # length each (the varlen kernel's grid), so the table is read at the document length.
    length = attended_length(x)
    pairs = x.mbs * x.heads / x.tp * (x.seq / length)
    eff = kernel_time.attention_efficiency(x.kernels, x.kernel_chip, head_dim, length / x.cp, pairs)
    if eff is None:
        return None
    fwd = flops / (x.peak_bf16_flops * eff)
    measured = (x.flash > 0) & np.isfinite(fwd)
    fwd = np.where(measured, fwd, modelled)
    bwd = np.where(measured, kernel_time.ATTENTION_BACKWARD_OVER_FORWARD, 2.5) * fwd
    return fwd, bwd


def kernel_count(ops: list[Op]) -> Col:
    """Forward kernel launches of the ops that exist for each candidate."""
    out: Col | float = 0.0
    for op in ops:
        present = (np.asarray(op.flops) + np.asarray(op.moved) + np.asarray(op.saved)) > 0
        out = out + np.where(present, op.kernels, 0.0)
    return np.asarray(out)


def _fwd_bwd(
    x: CostInputs, ops: list[Op], tokens: Col, known: dict[str, tuple[Col, Col]] | None = None
) -> tuple[Col, Col]:
    """Forward and backward time of `ops` together; `known` holds ops already timed (by
    name), so that the layer's subsets (its GEMMs, what recompute re-runs) are not looked up
    in the kernel tables again."""
    fwd = bwd = 0.0
    for op in ops:
        f, b = known[op.name] if known and op.name in known else _op_times(x, op, tokens)
        fwd = fwd + f
        bwd = bwd + b
    return np.asarray(fwd), np.asarray(bwd)


@dataclass(frozen=True)
class StepTime:
    """Seconds per optimizer step by part; they add up to `total`."""

    # forward + backward + recompute of all micro-batches (slowest stage), with the passes that
    # accumulate weight gradients outside the GEMM and FSDP's copies in and out
    compute: Col
    launch: Col  # time the host's kernel launches add beyond the GPU's work
    tp_comm: Col
    cp_comm: Col
    ep_comm: Col
    pp_comm: Col
    bubble: Col
    dp_comm: Col
    optimizer: Col
    offload: Col  # CPU offload: host-link copies and the CPU's Adam step not hidden (cost.offload)
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
            + self.offload
        )


def tp_blocks(x: CostInputs) -> Col:
    """Blocks of an average layer whose matmuls are split over TP, each with one collective
    pair in forward: attention, Mamba, dense MLPs, and MoE layers with shared experts (a
    tensor-parallel MLP beside the routed ones) or with expert TP but no expert parallelism
    (tokens gathered over tp, as Megatron-Core's all-gather dispatcher does). With expert
    parallelism the dispatch replaces the collective: the all-to-all and the etp group's
    gather of routed copies are charged in `step_time`."""
    moe_tp = np.where(((x.etp > 1) & (x.ep <= 1)) | (x.shared_ffn > 0), 1.0, 0.0)
    mlp = x.mlp_share * ((1.0 - x.moe_share) + x.moe_share * moe_tp)
    return np.where(x.tp > 1, x.attn_share + x.mamba_share + mlp, 0.0)


def _exposed(comm_s: Col, overlap: Col, cover: Col) -> Col:
    """Communication left on the critical path: all of it, or with overlap what exceeds the
    compute it runs beside."""
    return (1.0 - overlap) * comm_s + overlap * np.maximum(comm_s - cover, 0.0)


def step_time(
    x: CostInputs, ops: list[Op] | None = None, params: StageParams | None = None
) -> StepTime:
    tokens = x.mbs * x.seq / x.cp
    m = x.gbs / (x.dp * x.mbs)
    per_stage = stage_layers(x)
    ops = ops if ops is not None else layer_ops(x)
    params = params if params is not None else stage_params(x, ops)
    timed = {op.name: _op_times(x, op, tokens) for op in ops}
    f_gpu, b_gpu = _fwd_bwd(x, ops, tokens, timed)
    f_gemm, _ = _fwd_bwd(x, [op for op in ops if op.kind == "gemm"], tokens, timed)

    # Tensor parallel: one collective pair per TP-split block in forward, one in backward.
    # Under autocast the gathers (and their backward) carry the fp32 norm output and the
    # reductions the bf16 GEMM output: 3 bytes an element on average (not measured: one GPU).
    act_bytes = (2.0 + x.autocast_fp32) * tokens * x.hidden
    # With sequence parallelism the pair is an all-gather and a reduce-scatter (Korthikanti et
    # al. 2022, Sec. 4.2.2), which NCCL runs slower than one all-reduce of the same buffer.
    tp_link = comm.tp_link(x)
    tp_one = np.where(
        x.sp > 0,
        comm.all_gather(act_bytes, x.tp, tp_link) + comm.reduce_scatter(act_bytes, x.tp, tp_link),
        comm.all_reduce(act_bytes, x.tp, tp_link),
    )
    tp_layer = tp_blocks(x) * tp_one
    tp_f = _exposed(tp_layer, np.where(x.sp > 0, x.tp_overlap, 0.0), f_gemm)
    tp_b = _exposed(tp_layer, np.where(x.sp > 0, x.tp_overlap, 0.0), 2.0 * f_gemm)
    # The host launches kernels asynchronously: a layer takes the longer of its GPU time and
    # the time to launch its kernels (eager frameworks turn launch-bound at small per-rank
    # work, e.g. small micro-batches with wide TP); CUDA graphs replay them without the host.
    launch_f = (kernel_count(ops) + 2.0 * tp_blocks(x)) * x.kernel_s * (1.0 - x.cuda_graphs)
    f_busy, b_busy = f_gpu + tp_f, b_gpu + tp_b
    f_layer = np.maximum(f_busy, launch_f)
    b_layer = np.maximum(b_busy, 2.0 * launch_f)
    launch_excess = (f_layer - f_busy) + (b_layer - b_busy)

    recompute_ops = [op for op in ops if op.dropped_by_selective or op.kind == "attention"]
    f_attn, _ = _fwd_bwd(x, recompute_ops, tokens, timed)
    f_attn = np.maximum(f_attn, kernel_count(recompute_ops) * x.kernel_s)
    recomputed = recomputed_layers(x, per_stage)
    # Op-level SAC re-runs every memory-bound op and half of the matmuls.
    f_cheap, _ = _fwd_bwd(x, [op for op in ops if op.kind == "memory"], tokens, timed)
    extra_fwd = recomputed * f_layer + per_stage * np.select(
        [x.recompute == SELECTIVE, x.recompute == OP_LEVEL], [f_attn, f_cheap + 0.5 * f_gemm], 0.0
    )

    f_emb, b_emb = _fwd_bwd(x, embedding_ops(x), tokens)
    f_head, b_head = _fwd_bwd(x, head_ops(x), tokens)
    # the multi-token-prediction block: skipped (and its tables not looked up) where no
    # candidate has one
    f_mtp, b_mtp = _fwd_bwd(x, mtp_ops(x), tokens) if np.any(x.mtp > 0) else (ZERO, ZERO)
    mtp = x.mtp * (f_mtp + b_mtp + tp_f + tp_b)
    single = x.pp == 1
    ends = f_emb + b_emb + f_head + b_head + mtp
    last_extra = f_head + b_head + mtp
    stage_fwd = per_stage * f_layer + np.where(single, f_emb + f_head, f_head)
    stage_compute = _busiest_stage(
        x,
        per_stage,
        f_layer + b_layer + extra_fwd / per_stage,
        ends,
        np.where(single, ends, last_extra),
    )

    # TP time inside the layer times above, broken out for the report; the embedding and the
    # vocab-parallel cross-entropy add two more reduces.
    tp_head = np.where(x.tp > 1, 2.0 * tp_one, 0.0)
    tp_per_mb = per_stage * (tp_f + tp_b) + recomputed * tp_f + tp_head

    # Context parallel: K and V blocks (and their gradients) travel cp-1 hops per layer.
    _, _, kv_out = attention_widths(x)
    kv_bytes = 2.0 * tokens * kv_out / x.tp
    hop = comm.p2p(kv_bytes, comm.cp_link(x))
    attn_op = next(op for op in ops if op.kind == "attention")
    attn_f, attn_b = timed[attn_op.name]
    blocks = np.maximum(x.cp, 1.0)
    cp_f = (x.cp - 1.0) * np.maximum(hop - attn_f / blocks, 0.0)
    cp_b = (x.cp - 1.0) * np.maximum(2.0 * hop - attn_b / blocks, 0.0)
    cp_per_mb = np.where(x.cp > 1, per_stage * x.attn_share * (cp_f + cp_b), 0.0)

    # Expert parallel: dispatch + combine in forward and backward for every MoE layer. A rank
    # sends its own 1/tp of the tokens (see layer.mlp_ops); an expert-tensor-parallel group
    # then all-gathers its etp ranks' routed copies (and reduce-scatters them in the combine),
    # as Megatron-Core's all-to-all dispatcher does.
    expert_h = np.where(x.moe_latent > 0, x.moe_latent, x.hidden)
    shard_bytes = (2.0 + x.autocast_fp32) * tokens / x.tp * expert_h  # fp32 dispatch, bf16 combine
    ep_one = comm.expert_dispatch(x, shard_bytes, x.topk, x.ep, x.etp) + comm.all_gather(
        shard_bytes * x.topk * x.etp, x.etp, comm.group_link(x, x.etp, 1.0)
    )
    moe_layers = per_stage * x.mlp_share * x.moe_share
    ep_per_mb = np.where((x.experts > 0) & (x.ep > 1), 4.0 * moe_layers * ep_one, 0.0)

    # stage_compute already holds the layers' TP and launch time: report them apart.
    launch_per_mb = per_stage * launch_excess
    stage_compute = stage_compute + tp_head
    grad_passes = _gradient_accumulation(x, params, m)
    # one micro-batch, whole stage, with its share of the gradient passes (each in its backward)
    slot = stage_compute + cp_per_mb + ep_per_mb + grad_passes / m
    pure_compute = stage_compute - tp_per_mb - launch_per_mb
    bubble = (x.pp - 1.0) * slot / x.vp
    # a stage sends the residual stream: fp32 under autocast
    p2p_bytes = (2.0 + 2.0 * x.autocast_fp32) * tokens * x.hidden / np.where(x.sp > 0, x.tp, 1.0)
    p2p_one = comm.p2p(p2p_bytes, comm.pp_link(x))
    # Frameworks overlap pipeline sends with the interleaved schedule only.
    p2p_one = _exposed(p2p_one, np.where(x.vp > 1, x.p2p_overlap, 0.0), f_layer)
    # Two exchanges a micro-batch (forward and backward), each a batched send and receive; four
    # transfers where the framework sends and receives one at a time (p2p_serial).
    exchanges = 2.0 + 2.0 * x.p2p_serial
    pp_comm = np.where(x.pp > 1, (m * x.vp + x.pp - 1.0) * exchanges * p2p_one, 0.0)

    dp_comm, optimizer = _data_parallel(x, params, m, per_stage, f_layer, b_layer, stage_fwd)
    optimizer = optimizer + x.step_overhead_s * x.profile_step_overhead
    offload_s = (
        _offload(x, params, m, stage_fwd, per_stage * b_layer) if offload.any_offload(x) else ZERO
    )
    if activation_offload.any_offload(x):
        saved = saved_activations(x, per_stage, ops)[0] / np.maximum(per_stage, 1.0)
        offload_s = offload_s + activation_offload.step_seconds(
            x, saved, per_stage, m, f_layer, b_layer
        )
    return StepTime(
        compute=m * pure_compute + grad_passes + _fsdp_copies(x, params, m),
        launch=m * launch_per_mb,
        tp_comm=m * tp_per_mb,
        cp_comm=m * cp_per_mb,
        ep_comm=m * ep_per_mb,
        pp_comm=pp_comm,
        bubble=bubble,
        dp_comm=dp_comm,
        optimizer=optimizer,
        offload=offload_s,
        layer_fwd=f_layer,
        layer_bwd=b_layer,
    )


def _busiest_stage(x: CostInputs, per_stage: Col, layer: Col, ends: Col, last_extra: Col) -> Col:
    """Compute time per micro-batch of the slowest pipeline rank, by how the framework cuts the
    pipeline (vocab.PipelineSplit):

    - even (Megatron-Core's and NeMo's default, what --emit writes): without interleaving the
      first pp-1 ranks hold ceil(layers/pp) layers and the last the rest plus the LM head and
      loss (inputs.even_split_layers); interleaved, every rank its vp chunks and the last the
      head too;
    - ends_as_layers: the embedding and the head count as a layer each, so layers + 2 units
      split over the pp*vp chunks and the last rank holds one layer fewer, plus the head;
      a framework that can be told to (Megatron's --account-for-* flags) splits this way
      an interleaved layout that only divides so (inputs.counts_ends);
    - balanced (an explicit layout): the better of the even split and whole layers summing to
      the balanced share of the total;
    - compute_cost (nanotron): exactly that split (inputs.stage_layers, last_stage_layers).
    """
    piped = x.pp > 1
    per, last = even_split_layers(x.layers, x.pp)
    flat = np.maximum(per * layer, last * layer + last_extra)
    even = np.where(piped & (x.vp == 1), flat, per_stage * layer + last_extra)
    chunk_units = (x.layers + 2.0) / (x.pp * x.vp)
    # A middle rank holds whole chunks of layers; with two stages there is none, and the
    # first rank holds a layer fewer plus the embedding.
    ends_first = np.ceil(chunk_units - 1e-9) * x.vp * layer
    ends_first = np.where(x.pp == 2, ends_first - layer + (ends - last_extra), ends_first)
    ends_last = np.maximum(np.floor(chunk_units + 1e-9) * x.vp - 1.0, 0.0) * layer + last_extra
    counted = np.where(piped, np.maximum(ends_first, ends_last), even)
    balanced = np.ceil((x.layers * layer + ends) / (x.pp * layer) - 1e-9) * layer
    by_hand = np.where(piped, np.minimum(even, np.maximum(balanced, ends)), even)
    by_cost = np.maximum(per_stage * layer, last_stage_layers(x) * layer + last_extra)
    return np.select(
        [splits_by_cost(x), x.balanced_split > 0, counts_ends(x)],
        [by_cost, by_hand, counted],
        even,
    )


def _gradient_accumulation(x: CostInputs, p: StageParams, m: Col) -> Col:
    """Per step, the passes over the busiest rank's weight gradients that accumulate them
    outside the weight-gradient GEMM (memory-bound): `grad_pass_bytes` per parameter in every
    micro-batch, `grad_accumulate_bytes` in every one but the first."""
    held = sum(trained_params(x, p))
    moved = m * (x.grad_pass_bytes + np.where(_bf16_optimizer(x), x.bf16_pass_bytes, 0.0))
    moved = moved + np.maximum(m - 1.0, 0.0) * x.grad_accumulate_bytes
    return held * moved / (x.hbm_bytes_s * x.eff_memory)


def trained_params(x: CostInputs, p: StageParams) -> tuple[Col, Col]:
    """(non-expert, expert) parameters of the busiest rank that train, whose gradients are
    accumulated, reduced over data parallelism and updated: all of them, or with a frozen base
    (LoRA, QLoRA) only the adapters (cost.finetune)."""
    if not finetune.any_frozen(x):
        return p.busiest_dense, p.busiest_expert
    trained = 1.0 - finetune.frozen(x)
    return trained * p.busiest_dense + p.busiest_adapter, trained * p.busiest_expert


def held_weight_bytes(x: CostInputs, p: StageParams) -> tuple[Col, Col]:
    """(non-expert, expert) bytes of the busiest rank's working weights, which ZeRO-3 and FSDP
    gather whether they train or not: every weight at the working precision, the layers'
    linear weights in NF4 under QLoRA, and the adapters."""
    if not finetune.any_frozen(x):
        return x.param_bytes * p.busiest_dense, x.param_bytes * p.busiest_expert
    base = finetune.base_weight_bytes(x)
    dense = x.param_bytes * (p.busiest_dense - p.busiest_linear + p.busiest_adapter)
    return dense + base * p.busiest_linear, base * p.busiest_expert


def _has_stage_bit(bits: Col, zero: Col) -> np.ndarray:
    """Whether each row's ZeRO stage is among the stages a per-stage bitmask names
    (`columns.reduce_bits`: 1 << stage)."""
    stage_bit = np.left_shift(1, np.clip(np.nan_to_num(zero), 0, 3).astype(np.int64))
    return np.bitwise_and(np.asarray(bits).astype(np.int64), stage_bit) > 0


def _fsdp_zero2(x: CostInputs) -> np.ndarray:
    """ZeRO-2 rows whose framework reshards the weights after each backward (FSDP), so a
    forward gathers them again (`zero2_gathers_every_micro_batch`)."""
    return (x.zero2_gathers_every_micro_batch > 0) & (x.zero == 2)


def _reduces_every_micro_batch(x: CostInputs) -> np.ndarray:
    """Rows whose ZeRO-0/1/2 gradient reduction runs in every micro-batch's backward: the
    framework's bit for the row's stage (`reduce_every_micro_batch`), without pipelining
    (a pipeline schedule holds every stage's reduction to its last micro-batch: Megatron-Core's
    no_sync_func, torch.distributed.pipelining's set_requires_gradient_sync(False))."""
    return _has_stage_bit(x.reduce_every_micro_batch, x.zero) & (x.zero <= 2) & (x.pp <= 1)


def _reduces_after_backward(x: CostInputs) -> np.ndarray:
    """Rows whose gradient reduction starts only after the stage's whole backward, so no
    backward hides it: the framework's bit for the row's ZeRO stage, from its pipelined bits
    under a pipeline schedule and its other bits without one (`reduce_after_backward`,
    `pipeline_reduce_after_backward`). Under torch.distributed.pipelining the final callback
    also makes the compute stream wait for the reduction, so an interleaved stage's other
    chunks do not hide it either (stage.py perform_reduce_grad)."""
    bits = np.where(x.pp > 1, x.pipeline_reduce_after_backward, x.reduce_after_backward)
    return _has_stage_bit(bits, x.zero)


def _fsdp_copies(x: CostInputs, p: StageParams, m: Col) -> Col:
    """Seconds per step of the copies torch's fully_shard makes on the compute stream
    (_fsdp_collectives.py), where the framework runs it (`fsdp_copies`) on ZeRO-3 or on a
    ZeRO-2 that reshards after backward: each all-gather's output split into the
    per-parameter weights (foreach_all_gather_copy_out: 2 x param_bytes a parameter, read and
    written), each reduction's gradients chunked into the reduce-scatter input in the
    reduction dtype (foreach_reduce_scatter_copy_in: read, then grad_comm_bytes written).
    Without a pipeline ZeRO-3 gathers twice a micro-batch (forward and backward) and reduces
    once, the resharding ZeRO-2 gathers once and reduces as often as the framework reduces
    (`reduce_every_micro_batch`); under a pipeline the weights stay gathered and the
    gradients accumulate in the reduction dtype until one reduction a step, which reads that
    accumulator. Every module is counted as resharding, though FSDP2 keeps its root (the
    embedding and head) gathered."""
    resharding = (x.zero >= 3) | _fsdp_zero2(x)
    piped = x.pp > 1
    gathers = np.select([piped, x.zero >= 3], [1.0, 2.0 * m], m)
    every = (x.zero >= 3) | _reduces_every_micro_batch(x)
    reductions = np.where(every & ~piped, m, 1.0)
    read = np.where(piped, x.grad_comm_bytes, 2.0)  # the fp32 accumulator, or bf16 gradients
    bandwidth = x.hbm_bytes_s * x.eff_memory
    if finetune.any_frozen(x):
        # every weight is gathered (and copied out), only the trained ones reduced
        (weights, expert_weights), (grads, expert_grads) = (
            held_weight_bytes(x, p),
            trained_params(x, p),
        )
        dense_on, expert_on = x.dp * x.cp > 1, p.expert_shards > 1
        gathered = np.where(dense_on, weights, 0.0) + np.where(expert_on, expert_weights, 0.0)
        reduced = np.where(dense_on, grads, 0.0) + np.where(expert_on, expert_grads, 0.0)
        copied_bytes = gathers * 2.0 * gathered + reductions * (read + x.grad_comm_bytes) * reduced
        return np.where((x.fsdp_copies > 0) & resharding, copied_bytes / bandwidth, 0.0)
    copied = gathers * 2.0 * x.param_bytes + reductions * (read + x.grad_comm_bytes)
    # the parameters a rank holds in a group of more than one (a group of one is charged
    # nothing, though torchtitan wraps it in fully_shard too)
    held = np.where(x.dp * x.cp > 1, p.busiest_dense, 0.0) + np.where(
        p.expert_shards > 1, p.busiest_expert, 0.0
    )
    return np.where((x.fsdp_copies > 0) & resharding, copied * held / bandwidth, 0.0)


def _bf16_optimizer(x: CostInputs) -> Col:
    """Rows whose bf16 gradients go through DeepSpeed's BF16_Optimizer: ZeRO 0/1 only."""
    return (x.bf16_optimizer > 0) & (x.zero < 2)


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
    # Data parallelism reduces, and ZeRO-1/2 gathers back, only what trains (with a frozen base,
    # the adapters); ZeRO-3 gathers every weight before its forward and its backward.
    dense, expert = trained_params(x, p)
    size, expert_size = x.dp * x.cp, p.expert_shards
    link, expert_link = comm.dp_link(x), comm.group_link(x, expert_size, x.ep * x.etp)

    def collectives(params: Col, n: Col, group: comm.Link) -> tuple[Col, Col, Col]:
        grads = x.grad_comm_bytes * params
        return (
            comm.all_reduce(grads, n, group),
            comm.reduce_scatter(grads, n, group),
            comm.all_gather(x.param_bytes * params, n, group),
        )

    ar_d, rs_d, ag_d = collectives(dense, size, link)
    ar_e, rs_e, ag_e = collectives(expert, expert_size, expert_link)
    ar, rs, ag = ar_d + ar_e, rs_d + rs_e, ag_d + ag_e
    ag_all = ag
    if finetune.any_frozen(x):
        weights, expert_weights = held_weight_bytes(x, p)
        ag_all = comm.all_gather(weights, size, link) + comm.all_gather(
            expert_weights, expert_size, expert_link
        )
    hides = (x.overlap_grad_reduce > 0) & ~_reduces_after_backward(x)
    window_b = np.where(hides, per_stage * b_layer, 0.0)
    window_f = np.where(x.overlap_param_gather > 0, stage_fwd, 0.0)
    # Each reduction hides behind the backward of the micro-batch it runs in: the last one's,
    # or every one's where the framework reduces in every micro-batch; one that starts after
    # the whole backward hides behind none (window_b is zero there).
    reductions = np.where(_reduces_every_micro_batch(x), m, 1.0)
    layers = np.maximum(per_stage, 1.0)
    ag_l, rs_l = ag_all / layers, rs / layers
    # One micro-batch's forward under FSDP: each layer's weights gathered before it, one layer
    # prefetched, so what exceeds a layer's compute is exposed and the first gather is not hidden.
    forward_gathers = per_stage * np.maximum(ag_l - f_layer, 0.0) + ag_l
    # FSDP's ZeRO-2 reshards after each backward, so every micro-batch's forward gathers again;
    # a pipeline schedule keeps the weights gathered (set_reshard_after_backward(False)).
    regathers = _fsdp_zero2(x) & (x.pp <= 1)
    gathers = np.where(regathers, m * forward_gathers, np.maximum(ag - window_f, 0.0))
    zero0 = reductions * np.maximum(ar - window_b, 0.0)
    # DeepSpeed's BF16_Optimizer all-reduces the whole fp32 gradients under ZeRO-1, then each
    # rank updates its shard and all-gathers it (engine.buffered_allreduce_fallback).
    reduce = np.where(_bf16_optimizer(x), ar, rs)
    zero12 = reductions * np.maximum(reduce - window_b, 0.0) + gathers
    # ZeRO-3: the same forward, and each layer's weights gathered again before its backward and
    # its gradients reduce-scattered after, one layer prefetched ahead.
    backward_gathers = per_stage * np.maximum(ag_l + rs_l - b_layer, 0.0) + ag_l
    zero3 = m * (forward_gathers + backward_gathers) + rs_l
    # Under a pipeline schedule torch keeps a stage's FSDP weights gathered and its gradients
    # unreduced from the first micro-batch to the last (torch.distributed.pipelining.stage:
    # set_reshard_after_backward(False), set_requires_gradient_sync(False)): once per step,
    # as with ZeRO-1/2.
    if finetune.any_frozen(x):
        # a pipelined ZeRO-3 stage gathers every weight once a step, frozen or not
        piped = reductions * np.maximum(reduce - window_b, 0.0) + np.maximum(ag_all - window_f, 0.0)
        zero3 = np.where(x.pp > 1, piped, zero3)
    else:
        zero3 = np.where(x.pp > 1, zero12, zero3)
    dp_comm = np.select([x.zero >= 3, x.zero >= 1], [zero3, zero12], zero0)
    dp_comm = np.where(size * np.maximum(expert_size, 1.0) > 1, dp_comm, 0.0)
    # Adam reads the gradients and its states, writes the states and the working weights: the
    # states at the run's precision (cost.optimizer), so lighter state moves fewer bytes.
    traffic = 4.0 + 2.0 * optimizer_state_bytes(x) + x.param_bytes
    shard = np.where(x.zero >= 1, size, 1.0)
    expert_shard = np.where(x.zero >= 1, expert_size, 1.0)
    optimizer = traffic * (dense / shard + expert / expert_shard) / (x.hbm_bytes_s * x.eff_memory)
    # an offloaded optimizer steps on the CPU instead (cost.offload, StepTime.offload)
    optimizer = np.where(x.offload > 0, 0.0, optimizer)
    return dp_comm, optimizer


def _offload(x: CostInputs, p: StageParams, m: Col, forward: Col, backward: Col) -> Col:
    """Seconds per step of CPU offload (cost.offload) for the busiest rank: its optimizer shard
    (what trains, sharded as ZeRO shards the optimizer) and its weight shard (every weight, as
    ZeRO-3 shards them), one micro-batch's stage `forward` and `backward` to hide behind."""
    dense, expert = trained_params(x, p)
    size, expert_size = x.dp * x.cp, p.expert_shards
    shard = np.where(x.zero >= 1, size, 1.0)
    expert_shard = np.where(x.zero >= 1, expert_size, 1.0)
    optimizer_params = dense / shard + expert / expert_shard
    weight_params = p.busiest_dense / size + p.busiest_expert / expert_size
    if finetune.any_frozen(x):
        weight_params = weight_params + p.busiest_adapter / size
    # gradients reduced in every micro-batch's backward go down to the host each time (FSDP2's
    # CPUOffloadPolicy after each reduce-scatter; DeepSpeed's ZeRO-2 into its host buffer)
    every = ((x.zero >= 3) | _reduces_every_micro_batch(x)) & (x.pp <= 1)
    downs = np.where(every, m, 1.0)
    return offload.step_seconds(x, optimizer_params, weight_params, m, forward, backward, downs)
