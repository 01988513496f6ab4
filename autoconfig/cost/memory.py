"""Per-GPU memory: model states by ZeRO stage, activations by recompute mode, pipeline in-flight.

Sources:
- Mixed-precision Adam, Megatron style: 2 (16-bit weights) + 4 (fp32 gradients) + 12 (fp32
  master, Adam m and v) = 18 bytes/param; with the distributed optimizer (ZeRO-1) 6 + 12/d
  (Megatron-LM docs, "Distributed Optimizer"); ZeRO-2/3 shard gradients and weights too
  (Rajbhandari et al. 2020, "ZeRO", Sec. 5).
- Lighter Adam state (bf16 or fp8 moments, fp32 main parameters as 16-bit remainders):
  cost.optimizer.
- CPU offload: the optimizer (and with parameter offload the sharded weights and gradients)
  leave the GPU for host memory, reported apart as `host` (cost.offload).
- Activations per layer from the op list (layer.py, Korthikanti et al. 2022).
- LoRA and QLoRA (cost.finetune): frozen base weights keep only their working copy (NF4 under
  QLoRA), the adapters train with full state (`task_state_bytes`).
- 1F1B: the first stage holds min(p, m) micro-batches; interleaved schedules hold
  2(p-r-1) + (v-1)p + 1 model chunks on rank r, which for r = 0 is the (1 + (p-1)/(p v))
  factor of Korthikanti et al. 2022, Sec. 4.2.3 (Megatron-LM's warm-up counts).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autoconfig.cost import activation_offload, finetune, offload, optimizer
from autoconfig.cost.inputs import (
    OP_LEVEL,
    SELECTIVE,
    Col,
    CostInputs,
    last_stage_layers,
    last_stage_rank,
    recomputed_layers,
    stage_layers,
)
from autoconfig.cost.layer import (
    ZERO,
    Op,
    embedding_ops,
    head_ops,
    layer_input_bytes,
    layer_ops,
    op_level_sac_bytes,
    total,
)
from autoconfig.spec.vocab import GIB


@dataclass(frozen=True)
class StageParams:
    """Parameters held by one rank of the first and of the last pipeline stage."""

    dense_first: Col  # sharded over dp*cp by ZeRO
    dense_last: Col
    expert: Col  # routed experts on one rank: sharded over expert_shards by ZeRO
    expert_last: Col  # (the last stage also holds the multi-token-prediction blocks' experts)
    layer_dense: Col  # one layer's non-expert params on one rank (ZeRO-3 gather unit)
    layer_expert: Col
    expert_shards: Col  # expert data parallelism: tp*dp*cp / (ep*etp) ranks hold each expert
    # Fine-tuning (cost.finetune; zero where no candidate freezes its base): the LoRA adapters'
    # parameters, and of the non-expert parameters those of the layers' linear weights (NF4
    # under QLoRA), on the rank of the first and of the last stage, and per layer.
    adapter_first: Col = ZERO
    adapter_last: Col = ZERO
    linear_first: Col = ZERO
    linear_last: Col = ZERO
    layer_adapter: Col = ZERO
    layer_linear: Col = ZERO

    @property
    def busiest_dense(self) -> Col:
        """Non-expert parameters of the rank of the first or last stage that holds more."""
        return np.maximum(self.dense_first, self.dense_last)

    @property
    def busiest_expert(self) -> Col:
        return np.maximum(self.expert, self.expert_last)

    @property
    def busiest_adapter(self) -> Col:
        return np.maximum(self.adapter_first, self.adapter_last)

    @property
    def busiest_linear(self) -> Col:
        return np.maximum(self.linear_first, self.linear_last)


def layer_params(ops: list[Op]) -> tuple[Col, Col]:
    """(non-expert, routed-expert) parameters of an average layer on one rank, from the op
    list: GEMM weights (2 bytes a parameter in `weight_bytes`) and the other parameters."""
    gemm = [op for op in ops if op.kind == "gemm"]
    dense = total([op for op in gemm if not op.routed], "weight_bytes") / 2.0 + total(ops, "params")
    expert = total([op for op in gemm if op.routed], "weight_bytes") / 2.0
    return dense, expert


def stage_params(x: CostInputs, ops: list[Op] | None = None) -> StageParams:
    """Per-rank parameter counts: layers/pp layers split by tp (experts by ep*etp)."""
    layer_dense, layer_expert = layer_params(ops if ops is not None else layer_ops(x))
    h, t = x.hidden, x.tp
    per_stage, last_layers = stage_layers(x), last_stage_layers(x)
    vocab_shard = x.vocab * h / t
    final_norm = np.where(x.layernorm > 0, 2.0, 1.0) * h
    first_extra = vocab_shard + x.learned_pos * x.max_seq * h
    # Tied embeddings share one matrix only when first and last stage are the same rank.
    head = np.where((x.tied > 0) & (x.pp == 1), 0.0, vocab_shard) + final_norm
    # Each multi-token-prediction block: a layer, a 2h -> h projection and two norms.
    mtp_dense = x.mtp * (layer_dense + 2.0 * h * h / t + 2.0 * final_norm)
    single = x.pp == 1
    dense_first = per_stage * layer_dense + first_extra + np.where(single, head + mtp_dense, 0.0)
    dense_last = last_layers * layer_dense + head + mtp_dense + np.where(single, first_extra, 0.0)
    expert = per_stage * layer_expert
    expert_last = last_layers * layer_expert + x.mtp * layer_expert
    shards = np.maximum(x.tp * x.dp * x.cp / (x.ep * x.etp), 1.0)
    if not finetune.any_frozen(x):
        return StageParams(
            dense_first, dense_last, expert, expert_last, layer_dense, layer_expert, shards
        )
    ops = ops if ops is not None else layer_ops(x)
    gemms = [op for op in ops if op.kind == "gemm" and not op.routed and not op.sixteen_bit]
    layer_linear = total(gemms, "weight_bytes") / 2.0
    layer_adapter = total(ops, "adapter_params")
    # the last stage's multi-token-prediction blocks each hold a layer
    first_layers = per_stage + np.where(single, x.mtp, 0.0)
    last_layers_all = last_layers + x.mtp
    return StageParams(
        dense_first,
        dense_last,
        expert,
        expert_last,
        layer_dense,
        layer_expert,
        shards,
        adapter_first=first_layers * layer_adapter,
        adapter_last=last_layers_all * layer_adapter,
        linear_first=first_layers * layer_linear,
        linear_last=last_layers_all * layer_linear,
        layer_adapter=layer_adapter,
        layer_linear=layer_linear,
    )


def state_bytes(x: CostInputs, params: Col, shard: Col) -> tuple[Col, Col, Col]:
    """(weights, gradients, optimizer) bytes for `params` sharded `shard` ways by ZeRO stage:
    the working weights at the framework's parameter precision, fp32 main gradients, and the
    optimizer's master weights and Adam moments at the run's optimizer state (cost.optimizer:
    fp32 by default)."""
    # With pipelining a ZeRO-3 stage holds its gathered weights and unreduced gradients for the
    # whole step (see timing._data_parallel); only the optimizer state stays sharded.
    zero = np.where((x.zero >= 3) & (x.pp > 1), 1.0, x.zero)
    weights = np.where(zero >= 3, x.param_bytes / shard, x.param_bytes) * params
    grads = np.where(zero >= 2, 4.0 / shard, 4.0) * params
    kept = optimizer.state_bytes(x)
    optim = np.where(zero >= 1, kept / shard, kept) * params
    return weights, grads, optim


def task_state_bytes(
    x: CostInputs, params: Col, linear: Col, adapters: Col, shard: Col
) -> tuple[Col, Col, Col]:
    """(weights, gradients, optimizer) bytes as `state_bytes`, for a task that may freeze its
    base (cost.finetune): `params` base parameters, of which `linear` are the layers' linear
    weights, and `adapters` LoRA parameters. Frozen weights keep only their working copy (NF4
    linear weights under QLoRA): no gradient, no optimizer state, no fp32 master copy (Hu et
    al. 2021, Sec. 4.2); the adapters train as every weight of a full run does (16-bit working
    copy, fp32 gradient, fp32 master and Adam moments). ZeRO shards them as it shards any."""
    zero = np.where((x.zero >= 3) & (x.pp > 1), 1.0, x.zero)
    trained = (1.0 - finetune.frozen(x)) * params + adapters
    base = x.param_bytes * (params - linear) + finetune.base_weight_bytes(x) * linear
    weights = np.where(zero >= 3, 1.0 / shard, 1.0) * (base + x.param_bytes * adapters)
    grads = np.where(zero >= 2, 4.0 / shard, 4.0) * trained
    kept = optimizer.state_bytes(x)
    optim = np.where(zero >= 1, kept / shard, kept) * trained
    return weights, grads, optim


def in_flight(x: CostInputs, rank: Col) -> Col:
    """Micro-batches whose activations pipeline rank `rank` holds at its peak (in units of
    a full stage's worth, so interleaving's chunks count as 1/v each)."""
    m = x.gbs / (x.dp * x.mbs)
    one_f_one_b = np.minimum(m, x.pp - rank)
    chunks = np.minimum(m * x.vp, 2.0 * (x.pp - rank - 1) + (x.vp - 1) * x.pp + 1)
    return np.where(x.vp > 1, chunks / x.vp, one_f_one_b)


def gradients_at_peak(x: CostInputs, gradients: Col, activations: Col) -> Col:
    """The gradient bytes the peak holds beside `activations` (one micro-batch's saved
    tensors and the embedding and head buffers). Where the gradients are freed after each step
    and a step is one micro-batch on one rank of its model (no data, context or pipeline
    parallelism, whose buckets and schedules keep gradients alive), backward frees each layer's
    saved tensors as it makes that layer's gradients: the peak holds the larger of the two,
    not their sum, so only the gradients beyond the activations count. Measured on one H200
    (docs/gpu_measurements.md): a step of one micro-batch peaked 1.53 GiB (a llama3-70b slice)
    and 4.89 GiB (gpt3-1.3b) below the same step of two, about the gradients' size."""
    single_step = (x.gbs / (x.dp * x.mbs) <= 1.0) & (x.dp * x.cp == 1) & (x.pp == 1)
    freed = (x.grads_freed_each_step > 0) & single_step
    return np.where(freed, np.maximum(gradients - activations, 0.0), gradients)


@dataclass(frozen=True)
class Memory:
    """Peak bytes per GPU by part (for the larger of the first and last stage)."""

    weights: Col
    gradients: Col
    optimizer: Col
    activations: Col  # one micro-batch of the stage's layers
    pipeline_in_flight: Col  # the extra micro-batches 1F1B keeps alive
    logits_embedding: Col  # embedding/LM-head/cross-entropy buffers
    transient: Col  # recompute working set, ZeRO-3 gathered layers
    overhead: Col  # fragmentation, workspaces, CUDA context
    activation_per_layer: Col  # mean bytes a stage's layer saves per micro-batch (trainer check)
    host: Col = ZERO  # bytes CPU offload keeps in host memory for this GPU (not in `total`)

    @property
    def total(self) -> Col:
        return (
            self.weights
            + self.gradients
            + self.optimizer
            + self.activations
            + self.pipeline_in_flight
            + self.logits_embedding
            + self.transient
            + self.overhead
        )


def layer_activation_bytes(
    x: CostInputs, tokens: Col, ops: list[Op] | None = None
) -> tuple[Col, Col, Col, Col]:
    """Saved bytes per layer per micro-batch: (no recompute, selective, full, op-level)."""
    ops = ops if ops is not None else layer_ops(x)
    keep = total(ops, "saved")
    dropped = total([op for op in ops if op.dropped_by_selective], "saved")
    return (
        keep * tokens,
        (keep - dropped) * tokens,
        layer_input_bytes(x) * tokens,
        np.minimum(op_level_sac_bytes(x), keep) * tokens,
    )


def saved_activations(x: CostInputs, layers: Col, ops: list[Op] | None = None) -> tuple[Col, Col]:
    """(saved bytes of one micro-batch, recompute working set) of a rank with `layers`, by
    the layout's recompute mode."""
    tokens = x.mbs * x.seq / x.cp
    plain, selective, full, op_level = layer_activation_bytes(x, tokens, ops)
    per_mb_layer = np.select(
        [x.recompute == SELECTIVE, x.recompute == OP_LEVEL], [selective, op_level], plain
    )
    recomputed = recomputed_layers(x, layers)
    saved = recomputed * full + (layers - recomputed) * per_mb_layer
    # Backward of a recomputed layer rebuilds that layer's activations one at a time.
    rebuilt = np.where(recomputed > 0, plain, np.maximum(plain - per_mb_layer, 0.0))
    return saved, np.where(layers > 0, rebuilt, 0.0)


def memory(x: CostInputs, ops: list[Op] | None = None, params: StageParams | None = None) -> Memory:
    tokens = x.mbs * x.seq / x.cp
    plain = layer_activation_bytes(x, tokens, ops)[0]

    def stage_activations(layers: Col) -> tuple[Col, Col]:
        return saved_activations(x, layers, ops)

    per_stage = stage_layers(x)
    stage_act, transient = stage_activations(per_stage)
    last_act, last_transient = stage_activations(last_stage_layers(x))
    per_layer_act = stage_act / per_stage  # what the trainer's check reads, before offload
    act_host = last_act_host = ZERO
    if activation_offload.any_offload(x):
        stage_act, act_host = activation_offload.gpu_and_host(x, stage_act, per_stage)
        last_act, last_act_host = activation_offload.gpu_and_host(x, last_act, last_stage_layers(x))

    p = params if params is not None else stage_params(x, ops)
    shard = x.dp * x.cp
    # ZeRO-3 holds the gathered weights (and their gradients) of the layer it computes and of
    # the one it prefetches.
    gathered = 2.0 * (x.param_bytes + 4.0) * (p.layer_dense + p.layer_expert)
    tuning = finetune.any_frozen(x)
    if tuning:
        # a frozen layer gathers its weights (NF4 linears under QLoRA) without gradients
        frozen_layer = task_state_bytes(
            x, p.layer_dense, p.layer_linear, p.layer_adapter, np.float64(1.0)
        )[:2]
        expert_layer = task_state_bytes(x, p.layer_expert, p.layer_expert, ZERO, np.float64(1.0))[
            :2
        ]
        gathered = 2.0 * (sum(frozen_layer) + sum(expert_layer))
    zero3_gather = np.where((x.zero >= 3) & (x.pp == 1), gathered, 0.0)
    # The last stage also runs the multi-token-prediction blocks.
    mtp_act = x.mtp * (plain + 2.0 * 2.0 * x.hidden * tokens)

    emb = total(embedding_ops(x), "saved") * tokens
    head = total(head_ops(x), "saved") * tokens + 4.0 * x.vocab / x.tp * tokens  # + dlogits

    first_flight, last_flight = in_flight(x, 0.0), in_flight(x, last_stage_rank(x))
    parts = []
    hosts = []
    offloading = offload.any_offload(x)
    single = x.pp == 1
    for dense, experts, flight, buffers, act, working, linear, adapters in (
        (
            p.dense_first,
            p.expert,
            first_flight,
            emb * first_flight,
            stage_act,
            transient,
            p.linear_first,
            p.adapter_first,
        ),
        (
            p.dense_last,
            p.expert_last,
            last_flight,
            head + mtp_act,
            last_act,
            last_transient,
            p.linear_last,
            p.adapter_last,
        ),
    ):
        if tuning:
            w, g, o = task_state_bytes(x, dense, linear, adapters, shard)
            ew, eg, eo = task_state_bytes(x, experts, experts, ZERO, p.expert_shards)
        else:
            w, g, o = state_bytes(x, dense, shard)
            ew, eg, eo = state_bytes(x, experts, p.expert_shards)
        buffers = np.where(single, emb + head + mtp_act, buffers)
        w, g, o = w + ew, g + eg, o + eo
        g = gradients_at_peak(x, g, act + buffers)
        if offloading:
            w, g, o, on_host = offload.gpu_and_host(x, w, g, o)
            hosts.append(on_host)
        parts.append(
            (
                w,
                g,
                o,
                act,
                act * (flight - 1.0),
                buffers,
                working + zero3_gather,
            )
        )
    first, last = (np.stack([np.broadcast_to(a, np.broadcast(*s).shape) for a in s]) for s in parts)
    use_last = last.sum(axis=0) > first.sum(axis=0)
    chosen = np.where(use_last, last, first)
    subtotal = chosen.sum(axis=0)
    overhead = x.mem_overhead * subtotal + x.mem_reserved_gib * GIB
    host = np.where(use_last, hosts[1], hosts[0]) if offloading else ZERO
    host = host + np.where(use_last, last_act_host, act_host)
    w, g, o, act, in_flight_mem, logits, transient = chosen
    return Memory(
        w,
        g,
        o,
        act,
        in_flight_mem,
        logits,
        transient,
        overhead=overhead,
        activation_per_layer=per_layer_act,
        host=host,
    )
