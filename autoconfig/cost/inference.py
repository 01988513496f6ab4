"""Serving cost: weights and KV cache per GPU, prefill and decode time, TTFT, TPOT, latency and
throughput of static batches, for N (tp, pp, batch, lengths) candidates at once.

The layer is the same op list the training model uses (layer.py), run forward only:
- Prefill processes batch*input tokens: each GEMM takes the roofline max of its FLOPs at the
  engine's GEMM efficiency and its bytes (weights once, activations) at the streaming
  bandwidth; causal attention FLOPs at the attention efficiency (Williams et al. 2009,
  roofline; Pope et al. 2022, "Efficiently Scaling Transformer Inference", Sec. 3.1).
- A decode step processes one token per sequence: the weights are streamed once per step and
  every sequence's K/V cache is read, so small batches are bound by HBM bandwidth and large
  ones by FLOPs (Pope et al. 2022, Sec. 2-3; Kwon et al. 2023, vLLM, Sec. 2.2). The mean step
  reads the cache at the mean context, input + output/2.
- TP: two all-reduces of the layer's activations per layer (Shoeybi et al. 2019). Their
  messages are KB-sized in decode, so they take NCCL's latency-bound tree path: a fixed cost
  plus one latency per tree level, log2(tp) (NCCL docs, "Tree" algorithm), plus the bytes at
  the ring bus bandwidth when large.
- PP: the batch is split into min(pp, batch) micro-batches that flow through the stages
  (GPipe, Huang et al. 2019): prefill takes (m + pp - 1) stage slots; a decode round takes
  max(m, pp) slots, each stage handing its activations to the next (FasterTransformer's
  pipeline-parallel decoding).
- MoE: every expert's weights are held; a decode step reads only the experts its batch's
  tokens are routed to, E*(1 - (1 - k/E)^b) of them in expectation for uniform routing, and
  computes only the top-k's FLOPs (Fedus et al. 2022; Lepikhin et al. 2020). Where the
  chip's fused-MoE table has the model's format and shape the routed experts take its
  measured time instead (serving_moe).
- KV cache per token and layer: 2 * kv_heads * head_dim * bytes / tp, with K/V heads
  replicated when tp exceeds kv_heads (GQA, Ainslie et al. 2023).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autoconfig.cost import comm, kernel_time, serving_gemm, serving_moe, serving_overheads
from autoconfig.cost.inputs import SWIGLU, Col, CostInputs
from autoconfig.cost.layer import Op, head_ops, layer_ops, mlp_widths
from autoconfig.cost.memory import stage_params
from autoconfig.spec.vocab import GIB

INFERENCE_COLUMNS = (
    "pred_ttft_ms",
    "pred_tpot_ms",
    "pred_latency_ms",
    "pred_output_tokens_per_s_per_gpu",
    "pred_fits",
)


# The engines a serving deployment can run on (ServeInputs.engine indexes it): "library" is a
# runtime without an engine profile (FasterTransformer, Megatron-LM's generate: C++ or plain
# torch, NCCL's all-reduce, no CUDA graphs); the others take their own all-reduce kernels from
# the measured tables and their CUDA-graph coverage from their profiles (spec/engines.py).
SERVING_ENGINES = ("library", "vllm", "sglang", "trtllm")


@dataclass(frozen=True)
class ServeInputs:
    """A serving workload on top of the layout's cost inputs (whose `seq` is the input length
    and whose dp is 1: replicas are independent)."""

    x: CostInputs
    batch: Col
    input_len: Col
    output_len: Col
    weight_bytes: Col  # per parameter: 2 (16-bit), 1 (fp8 / int8)
    kv_bytes: Col  # per cached element
    replicas: Col
    eff_memory: Col
    eff_gemm: Col
    kernel_s: Col
    ar_base_s: Col
    ar_step_s: Col
    # Continuous batching (cost/serving_step.py, cost/kv_cache.py); static batches ignore them.
    act_bytes: Col | float = 2.0  # per GEMM activation element: 2 (16-bit), 1 (fp8), 0.5625 (fp4)
    ep: Col | float = 1.0  # expert parallel over the tp ranks (ep = tp) or not (1)
    max_seqs: Col | float = 256.0  # most sequences running at once (max-num-seqs)
    max_tokens: Col | float = 8192.0  # most tokens per iteration (max-num-batched-tokens)
    kv_fraction: Col | float = 0.9  # share of the memory left after weights given to K/V
    block_tokens: Col | float = 16.0  # tokens per K/V-cache block (paged attention)
    # The engine: an index into SERVING_ENGINES. Its TP all-reduce is timed from the chip's
    # measured tables where they have it; the largest iteration (tokens) its CUDA graphs
    # capture (0: none), and whether they capture iterations with prefill tokens too.
    engine: Col | float = 1.0
    # The engine's host work per iteration (scheduler, input preparation, sampling): a fixed
    # part and a part per running sequence.
    iteration_s: Col | float = 0.0
    sequence_s: Col | float = 0.0
    graph_tokens: Col | float = 0.0
    graph_prefill: Col | float = 0.0


def _gemm(s: ServeInputs, op: Op, tokens: Col, weight_share: Col | float = 1.0) -> Col:
    x = s.x
    act = x.gemm_bytes
    # op.weight_bytes counts 16-bit weights; weight-only quantisation reads fewer.
    weights = op.weight_bytes * (s.weight_bytes / 2.0) * weight_share
    traffic = act * tokens * op.activation_width + weights
    compute = op.flops * tokens / (x.peak_flops * s.eff_gemm)
    roofline = np.maximum(compute, traffic / (x.hbm_bytes_s * s.eff_memory))
    rows = serving_gemm.applies(x, s.weight_bytes, s.act_bytes)
    measured = serving_gemm.measured_seconds(x, op, tokens, rows, s.weight_bytes)
    return roofline if measured is None else np.where(np.isfinite(measured), measured, roofline)


def small_all_reduce(s: ServeInputs, nbytes: Col) -> Col:
    """One TP all-reduce: latency-bound tree for small messages, ring bandwidth for big ones."""
    x = s.x
    link = comm.tp_link(x)
    n = x.tp
    latency = s.ar_base_s + s.ar_step_s * np.log2(np.maximum(n, 1.0))
    volume = 2.0 * (n - 1.0) / n * nbytes / link.bandwidth
    return np.where(n > 1, latency + volume, 0.0)


def measured_all_reduce(s: ServeInputs, nbytes: Col) -> Col | None:
    """One TP all-reduce of `nbytes` as the row's engine runs it, from the chip's measured
    tables (NaN where they lack it: a TP group beyond one node, a chip without tables); None
    where no row has tables."""
    x = s.x
    if not x.kernels:
        return None
    return kernel_time.serving_all_reduce_time(
        x.kernels, x.kernel_chip, s.engine, SERVING_ENGINES, x.tp, nbytes
    )


def tp_all_reduce(s: ServeInputs, nbytes: Col) -> Col:
    """One TP all-reduce: measured where the tables have it, else small_all_reduce's model."""
    modelled = small_all_reduce(s, nbytes)
    measured = measured_all_reduce(s, nbytes)
    if measured is None:
        return modelled
    return np.where(np.isfinite(measured), measured, modelled)


def _kv_heads_local(x: CostInputs) -> Col:
    return np.maximum(x.kv_heads / x.tp, 1.0)


def kv_bytes_per_token(s: ServeInputs, layers: Col) -> Col:
    """K and V of one token over `layers` layers on one rank."""
    x = s.x
    return 2.0 * _kv_heads_local(x) * x.head_dim * s.kv_bytes * layers


@dataclass(frozen=True)
class Phase:
    """One pipeline stage's time for one micro-batch, by part (seconds)."""

    compute: Col  # GEMMs, attention and memory-bound ops
    kernels: Col  # fixed per-kernel cost
    tp_comm: Col

    @property
    def total(self) -> Col:
        return self.compute + self.kernels + self.tp_comm

    def stage(self, layers: Col, head: Phase) -> Phase:
        """A stage of `layers` such layers plus the LM head (which only the last stage runs,
        but the slowest stage sets the pace)."""
        return Phase(
            layers * self.compute + head.compute,
            layers * self.kernels + head.kernels,
            layers * self.tp_comm + head.tp_comm,
        )


def _layer_phase(
    s: ServeInputs, ops: list[Op], tokens: Col, attention: Col, expert_share: Col
) -> Phase:
    """One layer over `tokens` tokens; `attention` is the attention core's time."""
    x = s.x
    work = attention
    # The routed experts as the fused MoE kernel runs them where the chip's table has the
    # model's format and shape (serving_moe), else their GEMMs' time.
    routed = serving_moe.layer_seconds(x, tokens, s.ep, s.weight_bytes, s.act_bytes)
    for op in ops:
        if op.kind == "gemm" and op.routed:
            roofline = _gemm(s, op, tokens, expert_share)
            work = work + (
                roofline if routed is None else np.where(np.isfinite(routed), 0.0, roofline)
            )
        elif op.kind == "gemm":
            work = work + _gemm(s, op, tokens)
        elif op.kind == "memory":
            work = work + op.moved * tokens / (x.hbm_bytes_s * s.eff_memory)
    if routed is not None:
        work = work + np.where(np.isfinite(routed), routed, 0.0)
    n = np.broadcast(work, x.kernel_chip).size
    kernels, _ = serving_overheads.kernel_costs(s, ops, n)
    tp = 2.0 * tp_all_reduce(s, 2.0 * tokens * x.hidden)
    return Phase(np.asarray(work), np.asarray(kernels), np.asarray(tp))


def _head_phase(s: ServeInputs, sequences: Col) -> Phase:
    """Final norm and LM head for the last position of each sequence, logits gathered."""
    x = s.x
    ops = [op for op in head_ops(x) if op.name != "cross_entropy"]
    work: Col | float = 0.0
    for op in ops:
        if op.kind == "gemm":
            work = work + _gemm(s, op, sequences)
        else:
            work = work + op.moved * sequences / (x.hbm_bytes_s * s.eff_memory)
    gather = tp_all_reduce(s, 2.0 * sequences * x.vocab) / 2.0
    n = np.broadcast(gather, x.kernel_chip).size
    _, kernels = serving_overheads.kernel_costs(s, layer_ops(x), n)
    return Phase(np.asarray(work), np.asarray(kernels), np.asarray(gather))


def _expert_share(x: CostInputs, tokens: Col) -> Col:
    """Fraction of the routed experts' weights a step reads: the expected distinct experts its
    tokens are routed to."""
    experts = np.maximum(x.experts, 1.0)
    touched = experts * (1.0 - np.power(1.0 - np.minimum(x.topk / experts, 1.0), tokens))
    return np.where(x.experts > 0, np.minimum(touched / experts, 1.0), 1.0)


@dataclass(frozen=True)
class ServeTime:
    ttft: Col
    tpot: Col
    latency: Col
    prefill_stage: Phase
    decode_stage: Phase
    pp_hop_prefill: Col
    pp_hop_decode: Col


def serve_time(s: ServeInputs) -> ServeTime:
    x = s.x
    ops = layer_ops(x)
    per_stage = np.ceil(x.layers / x.pp)
    micro = np.minimum(x.pp, s.batch)
    mb = np.ceil(s.batch / micro)

    # Prefill of one micro-batch through one stage (x.seq is the input length).
    tokens = mb * s.input_len
    attn_op = next(op for op in ops if op.kind == "attention")
    causal = np.where(x.flash > 0, 0.5, 1.0)
    attn_eff = np.where(x.flash > 0, x.eff_attention, s.eff_gemm)
    attn_prefill = attn_op.flops * tokens * causal / (x.peak_bf16_flops * attn_eff)
    layer_p = _layer_phase(s, ops, tokens, attn_prefill, _expert_share(x, tokens))
    # The LM head runs on one token per sequence in prefill and in decode alike.
    head = _head_phase(s, mb)
    prefill = layer_p.stage(per_stage, head)

    # One decode step of one micro-batch through one stage, at the mean cached context.
    context = s.input_len + s.output_len / 2.0
    q_width = x.heads * x.head_dim
    attn_flops = 4.0 * context * q_width / x.tp * mb
    attn_bytes = kv_bytes_per_token(s, 1.0) * context * mb
    attn_decode = np.maximum(
        attn_flops / (x.peak_bf16_flops * x.eff_attention),
        attn_bytes / (x.hbm_bytes_s * s.eff_memory),
    )
    layer_d = _layer_phase(s, ops, mb, attn_decode, _expert_share(x, mb))
    decode = layer_d.stage(per_stage, head)

    link = comm.pp_link(x)
    hop_p = np.where(x.pp > 1, comm.p2p(2.0 * tokens * x.hidden / x.tp, link), 0.0)
    hop_d = np.where(x.pp > 1, comm.p2p(2.0 * mb * x.hidden / x.tp, link), 0.0)
    # Outside a CUDA graph the host launches every kernel of a pass (serving_overheads).
    n = int(np.size(prefill.total))
    launch = serving_overheads.launch_seconds(s, ops, per_stage, n)
    prefill_s = np.where(
        serving_overheads.replayed(s, tokens, True),
        prefill.total,
        np.maximum(prefill.total, launch),
    )
    decode_s = np.where(
        serving_overheads.replayed(s, mb, False), decode.total, np.maximum(decode.total, launch)
    )
    ttft = (micro + x.pp - 1.0) * prefill_s + (x.pp - 1.0) * hop_p + s.iteration_s
    tpot = np.maximum(micro, x.pp) * decode_s + x.pp * hop_d + s.iteration_s
    tpot = tpot + s.sequence_s * s.batch
    latency = ttft + np.maximum(s.output_len - 1.0, 0.0) * tpot
    return ServeTime(ttft, tpot, latency, prefill, decode, hop_p, hop_d)


@dataclass(frozen=True)
class ServeMemory:
    weights: Col
    kv_cache: Col
    activations: Col
    overhead: Col

    @property
    def total(self) -> Col:
        return self.weights + self.kv_cache + self.activations + self.overhead


def serve_memory(s: ServeInputs) -> ServeMemory:
    """Bytes on the busiest GPU: its stage's weights, the whole batch's K/V cache at full
    length, the largest prefill intermediates of one micro-batch, and the allocator/runtime
    allowance of the GPU profile."""
    x = s.x
    p = stage_params(x)
    weights = (np.maximum(p.dense_first, p.dense_last) + p.expert_last) * s.weight_bytes
    per_stage = np.ceil(x.layers / x.pp)
    kv = kv_bytes_per_token(s, per_stage) * s.batch * (s.input_len + s.output_len)
    mb = np.ceil(s.batch / np.minimum(x.pp, s.batch))
    q_width, kv_width = x.heads * x.head_dim, x.kv_heads * x.head_dim
    up = np.where(x.mlp_kind == SWIGLU, 2.0, 1.0) * sum(mlp_widths(x))
    widest = np.maximum(q_width + 2.0 * kv_width, up) / x.tp
    activations = mb * s.input_len * 2.0 * (2.0 * x.hidden + widest) + 4.0 * mb * x.vocab / x.tp
    overhead = x.mem_overhead * (weights + kv + activations) + x.mem_reserved_gib * GIB
    return ServeMemory(weights, kv, activations, overhead)


def evaluate_serving(s: ServeInputs) -> dict[str, Col]:
    """Predictions and breakdowns, one array per column."""
    x = s.x
    t = serve_time(s)
    mem = serve_memory(s)
    gpus = x.tp * x.pp
    per_replica = s.batch * s.output_len / t.latency
    per_seq = kv_bytes_per_token(s, np.ceil(x.layers / x.pp)) * (s.input_len + s.output_len)
    free = x.memory_gib * GIB - mem.total
    out = {
        "pred_ttft_ms": 1e3 * t.ttft,
        "pred_tpot_ms": 1e3 * t.tpot,
        "pred_latency_ms": 1e3 * t.latency,
        "pred_output_tokens_per_s_per_gpu": per_replica / gpus,
        "pred_output_tokens_per_s": per_replica * s.replicas,
        "pred_fits": mem.total <= x.memory_gib * GIB,
        "pred_peak_mem_gib": mem.total / GIB,
        "mem_weights_gib": mem.weights / GIB,
        "mem_kv_cache_gib": mem.kv_cache / GIB,
        "mem_activations_gib": mem.activations / GIB,
        "mem_overhead_gib": mem.overhead / GIB,
        "mem_capacity_gib": x.memory_gib,
        "kv_headroom_gib": free / GIB,
        # more sequences of this length the GPU could still cache (with the allowance)
        "kv_headroom_seqs": np.floor(np.maximum(free, 0.0) / (per_seq * (1.0 + x.mem_overhead))),
        "time_prefill_compute_ms": 1e3 * t.prefill_stage.compute,
        "time_prefill_tp_ms": 1e3 * t.prefill_stage.tp_comm,
        "time_decode_compute_ms": 1e3 * t.decode_stage.compute,
        "time_decode_kernels_ms": 1e3 * t.decode_stage.kernels,
        "time_decode_tp_ms": 1e3 * t.decode_stage.tp_comm,
        "time_decode_pp_ms": 1e3 * t.pp_hop_decode,
    }
    n = int(np.prod(np.broadcast_shapes(*(np.shape(v) for v in out.values()))))
    return {k: np.broadcast_to(np.asarray(v), (n,)) for k, v in out.items()}
