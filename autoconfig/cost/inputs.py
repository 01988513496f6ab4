"""The cost model's input: one numpy column per quantity, N candidate configurations at once.

autoconfig.columns.build builds them from the specs once; every cost function then reads plain
arrays, and a scalar broadcasts against arrays, so a search over one model passes the model's
figures as scalars and only the layout columns as arrays. Coded choices (recompute, MLP kind)
hold the codes of autoconfig.spec.vocab.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import Field, dataclass, field, fields
from functools import cached_property
from typing import NamedTuple

import numpy as np

from autoconfig.cost import host
from autoconfig.cost.kernel_time import NO_KERNELS, KernelSet
from autoconfig.spec.vocab import Mlp, Recompute

Col = np.ndarray

# float32 halves the memory traffic of an exhaustive search; 7 significant digits are far
# finer than the model's accuracy.
DTYPE = np.float32

NO_RECOMPUTE, SELECTIVE, FULL, OP_LEVEL = (r.code for r in Recompute)
GELU, SWIGLU, SQUARED_RELU = (m.code for m in Mlp)


@dataclass(frozen=True)
class CostInputs:
    """Every quantity the cost model reads, as broadcastable float64 columns."""

    # architecture
    layers: Col
    hidden: Col
    heads: Col
    kv_heads: Col
    head_dim: Col
    ffn: Col
    vocab: Col
    tied: Col
    layernorm: Col
    mlp_kind: Col
    learned_pos: Col
    rope: Col  # rotary embeddings applied to q and k (not learned, ALiBi or no positions)
    max_seq: Col
    dropout: Col
    experts: Col
    topk: Col
    expert_ffn: Col
    shared_ffn: Col  # width of the always-on experts together
    moe_latent: Col  # latent width MoE tokens are projected to (0: none)
    # which blocks an average layer has (hybrid models, dense layers before MoE ones)
    attn_share: Col
    mlp_share: Col
    moe_share: Col  # of the MLP blocks, the share that are MoE
    mamba_share: Col
    # multi-head latent attention (0 when the model has none)
    q_lora: Col
    kv_lora: Col
    rope_dim: Col
    v_dim: Col
    window: Col  # sliding-window span (0: none)
    window_share: Col  # share of layers attending within it
    mamba_heads: Col
    mamba_head_dim: Col
    mamba_state: Col
    mamba_groups: Col
    mtp: Col  # multi-token-prediction blocks on the last stage
    # hardware
    peak_flops: Col  # FLOP/s at the run's precision
    hbm_bytes_s: Col
    sms: Col  # streaming multiprocessors (0: GEMM waves not modelled)
    memory_gib: Col
    eff_gemm: Col
    eff_attention: Col
    eff_memory: Col
    kernel_s: Col
    eff_intra: Col
    eff_inter: Col
    lat_intra_s: Col
    lat_inter_s: Col
    step_overhead_s: Col
    mem_overhead: Col
    mem_reserved_gib: Col
    gpus_per_node: Col
    intra_bytes_s: Col
    inter_bytes_s: Col
    gemm_bytes: Col  # bytes per GEMM operand element at the run's precision
    # the host side (cost.host): bytes/s per GPU, one direction, of the host link and of the
    # host DRAM share; host memory per GPU in GiB (NaN: not stated)
    host_link_bytes_s: Col
    host_dram_bytes_s: Col
    host_memory_gib: Col
    # layout
    dp: Col
    tp: Col
    pp: Col
    vp: Col
    cp: Col
    ep: Col
    etp: Col
    sp: Col
    mbs: Col
    gbs: Col
    seq: Col
    recompute: Col
    recompute_layers: Col  # layers per stage fully recomputed (full recompute only)
    zero: Col
    optimizer_state: Col  # vocab.OptimizerState code: the Adam state's precision
    offload: Col  # vocab.Offload code: what stays in host memory (cost.offload)
    hybrid_cp: Col  # 1: dynamic context parallelism over packed documents (cost.hybrid_cp)
    activation_offload: Col  # 1: saved activations kept in host memory (cost.activation_offload)
    # what the framework does (columns.Behaviour, from its profile)
    flash: Col
    overlap_grad_reduce: Col
    overlap_param_gather: Col
    tp_overlap: Col  # TP collectives overlapped with the GEMMs they feed (needs SP)
    p2p_overlap: Col  # pipeline sends overlapped with compute (interleaved schedules)
    cuda_graphs: Col  # kernel launches replayed from a captured graph
    fused_kernels: Col  # Transformer Engine-style fused activations (SwiGLU keeps its input)
    ep_dedup: Col  # MoE dispatch sends a token once per node, fanned out over NVLink
    param_bytes: Col  # bytes per parameter of the working weight copy (1 with fp8 params)
    grad_comm_bytes: Col  # bytes per gradient element reduced over data parallelism
    optim_bytes: Col  # optimizer bytes per parameter (fp32 master + Adam moments)
    # 1 where lighter Adam state keeps fp32 main parameters as 16-bit remainders of the bf16
    # working copy (cost.optimizer)
    main_param_remainders: Col
    # CPU offload (cost.offload): bytes a parameter the host sends up, and the overlap of the
    # host copies (schema.OFFLOAD_OVERLAPS index)
    offload_upload_bytes: Col
    offload_overlap: Col
    # activation offload (cost.activation_offload): layers whose saved activations stay on
    # the GPU
    act_offload_resident: Col
    # 1 where SP's all-gathered block inputs are saved for backward (torch DTensor, the
    # bundled trainer); 0 where only the shard is and backward re-gathers (Megatron-LM).
    sp_saves_gathered: Col
    # 1 where the framework places pipeline blocks by its own compute-cost estimate (nanotron),
    # 0 where layers split evenly over the stages.
    cost_split: Col
    # 1 where whole layers are placed by hand against what the embedding and the LM head cost
    # (an explicit pipeline layout).
    balanced_split: Col
    # 1 where the embedding and the LM head each count as one layer in the even split
    # (Megatron's --account-for-*-in-pipeline-split, torchtitan's *_stage_less_layers).
    ends_split: Col
    # 1 where the framework can be told to count the embedding and the LM head as a layer each
    # (Megatron's --account-for-*-in-pipeline-split): it does so for an interleaved layout
    # whose layers alone do not divide into its pp*vp chunks but layers + 2 do
    # (`interleaves_by_counting_ends`).
    ends_split_to_interleave: Col
    # 1 where the layers run under torch.autocast over fp32 weights (the bundled trainer on
    # GPU): the residual stream and the norms' inputs and outputs are fp32, and every linear
    # casts, and keeps for backward, its own bf16 copy of its input (q, k and v three copies).
    autocast_fp32: Col
    # 1 where RMSNorm runs as eager tensor ops (layer.eager_norm_passes)
    eager_rmsnorm: Col
    # 1 where a step pays step_overhead_s (columns.Behaviour.profile_step_overhead)
    profile_step_overhead: Col
    # 1 where gradients are freed after each step (columns.Behaviour.grads_freed_each_step)
    grads_freed_each_step: Col
    # Bytes moved per parameter of a rank to accumulate its weight gradient outside the GEMM:
    # in every micro-batch, and in every micro-batch but the first (columns.Behaviour).
    grad_pass_bytes: Col
    grad_accumulate_bytes: Col
    # The ZeRO stages below 3 whose gradient reduction runs in every micro-batch's backward
    # rather than only the last one's, as bits (1 << stage; columns.Behaviour).
    reduce_every_micro_batch: Col
    # 1 where the framework's ZeRO-2 reshards the weights after each backward (FSDP), so each
    # micro-batch gathers them again (columns.Behaviour).
    zero2_gathers_every_micro_batch: Col
    # The ZeRO stages whose gradient reduction starts after the whole backward, unhidden,
    # without and with a pipeline, as bits (columns.Behaviour).
    reduce_after_backward: Col
    pipeline_reduce_after_backward: Col
    # 1 where FSDP's gathers and reduce-scatters copy on the compute stream (columns.Behaviour).
    fsdp_copies: Col
    # 1 where a bf16 run at ZeRO 0/1 uses DeepSpeed's BF16_Optimizer, and the bytes a parameter
    # its gradient copy costs every micro-batch (Behaviour).
    bf16_optimizer: Col
    p2p_serial: Col  # 1: a stage's pipeline sends and receives run one at a time (4 a micro-batch)
    bf16_pass_bytes: Col
    peak_bf16_flops: Col  # MFU is quoted against the bf16 peak for every precision
    # The training task (vocab.Task codes: pretrain 0, sft 1, lora 2, qlora 3), the LoRA
    # adapters' rank and the layers they target (vocab.LoraTargets codes: qkv 1, attention 2,
    # all 3; 0 without adapters). cost.finetune reads them.
    task: Col
    lora_rank: Col
    lora_targets: Col
    # Packed documents' length as the average token sees it, E[l^2]/E[l] (0: the sequence is
    # one document), and the share of computed tokens that are not padding (spec.documents).
    doc_len: Col
    useful_share: Col
    # Index of the row's chip in `kernels` (its measured GEMM and attention tables); -1 where
    # the chip has none and the profile's efficiency constants time those ops.
    kernel_chip: Col
    # The measured kernel tables the `kernel_chip` codes index (not a column: shared by rows).
    kernels: KernelSet = field(default=NO_KERNELS, metadata={"column": False})
    # Packed documents as (length, share of documents) rows at the run's sequence length
    # (spec.documents.DocLengths.classes; not a column: shared by rows). Only dynamic context
    # parallelism reads them (cost.hybrid_cp); no rows for whole or padded sequences.
    doc_classes: np.ndarray = field(
        default_factory=lambda: np.zeros((0, 2)), metadata={"column": False}
    )

    @cached_property
    def cost_split_stages(self) -> CostSplit:
        """nanotron's split of these layouts (`cost_split_layers`), solved once per inputs."""
        gated = self.mlp_kind == SWIGLU
        return cost_split_layers(self.layers, self.hidden, self.ffn, self.vocab, self.pp, gated)

    @property
    def n(self) -> int:
        shapes = [np.shape(getattr(self, f.name)) for f in column_fields()]
        return int(np.prod(np.broadcast_shapes(*shapes)))

    def take(self, rows: np.ndarray) -> CostInputs:
        """The inputs of the given rows (scalar columns stay scalars)."""
        values: dict[str, object] = {"kernels": self.kernels, "doc_classes": self.doc_classes}
        for f in column_fields():
            col = getattr(self, f.name)
            values[f.name] = col if np.ndim(col) == 0 else np.broadcast_to(col, (self.n,))[rows]
        return CostInputs(**values)  # type: ignore[arg-type]

    @classmethod
    def from_columns(cls, cols: Mapping[str, object]) -> CostInputs:
        """Builds from a mapping of column name -> scalar or array. Missing names raise,
        except the framework-behaviour flags, which default to Megatron-LM's
        (OPTIONAL_COLUMNS)."""
        cols = {**OPTIONAL_COLUMNS, **cols}
        values: dict[str, object] = {
            "kernels": cols.get("kernels", NO_KERNELS),
            "doc_classes": np.asarray(cols.get("doc_classes", np.zeros((0, 2))), float),
        }
        for f in column_fields():
            if f.name not in cols:
                raise KeyError(f"cost input column '{f.name}' is missing")
            values[f.name] = np.asarray(cols[f.name], dtype=DTYPE)
        return cls(**values)  # type: ignore[arg-type]


def column_fields() -> tuple[Field, ...]:
    """The CostInputs fields that are columns (all but the shared kernel tables)."""
    return tuple(f for f in fields(CostInputs) if f.metadata.get("column", True))


# Framework-behaviour flags and their Megatron-LM values (overlapped gradient reduction,
# sequence parallelism saving only the shard, bf16 working weights, fp32 gradients reduced,
# fp32 master weights with fp32 Adam moments), the architecture columns of plain dense
# transformers, and the pretraining task (every weight trained, no adapters).
OPTIONAL_COLUMNS = {
    "overlap_grad_reduce": 1.0,
    "overlap_param_gather": 0.0,
    "tp_overlap": 0.0,
    "p2p_overlap": 0.0,
    "cuda_graphs": 0.0,
    "fused_kernels": 0.0,
    "ep_dedup": 0.0,
    "param_bytes": 2.0,
    "grad_comm_bytes": 4.0,
    "optim_bytes": 12.0,
    "main_param_remainders": 0.0,
    "optimizer_state": 0.0,
    "offload": 0.0,
    "hybrid_cp": 0.0,
    "activation_offload": 0.0,
    "offload_upload_bytes": 2.0,
    "offload_overlap": 0.0,
    "act_offload_resident": 2.0,
    "host_link_bytes_s": host.DEFAULT_HOST_LINK_GB_S * 1e9,
    "host_dram_bytes_s": host.DEFAULT_HOST_DRAM_GB_S * host.HOST_DRAM_EFFICIENCY * 1e9,
    "host_memory_gib": np.nan,
    "sp_saves_gathered": 0.0,
    "cost_split": 0.0,
    "balanced_split": 0.0,
    "ends_split": 0.0,
    "ends_split_to_interleave": 0.0,
    "autocast_fp32": 0.0,
    "eager_rmsnorm": 0.0,
    "profile_step_overhead": 1.0,
    "grads_freed_each_step": 0.0,
    "grad_pass_bytes": 0.0,
    "grad_accumulate_bytes": 0.0,
    "reduce_every_micro_batch": 0.0,
    "zero2_gathers_every_micro_batch": 0.0,
    "reduce_after_backward": 0.0,
    "pipeline_reduce_after_backward": 0.0,
    "fsdp_copies": 0.0,
    "bf16_optimizer": 0.0,
    "p2p_serial": 0.0,
    "bf16_pass_bytes": 0.0,
    "etp": 1.0,
    "kernel_chip": -1.0,
    "task": 0.0,
    "lora_rank": 0.0,
    "lora_targets": 0.0,
    "doc_len": 0.0,
    "useful_share": 1.0,
}


def busiest_rank_layers(layers: Col, pp: Col, vp: Col) -> Col:
    """Layers on the busiest pipeline rank: vp chunks of ceil(layers / (pp*vp)) each (uneven
    splits put the extra layer on some ranks). An interleaved layout that divides only with
    the embedding and the head counted as layers (`interleaves_by_counting_ends`) gives every
    rank (layers + 2)/pp units, the first and the last one layer fewer: with two stages both
    ranks hold layers/2. Such a layout runs only that way (a framework that cannot count the
    ends cannot interleave it), so the count does not ask the framework."""
    even = np.ceil(layers / (pp * vp)) * vp
    counted = (np.asarray(layers, float) + 2.0) / pp - np.where(np.asarray(pp) == 2, 1.0, 0.0)
    return np.where(interleaves_by_counting_ends(layers, pp, vp), counted, even)


def even_split_layers(layers: Col, pp: Col) -> tuple[Col, Col]:
    """Megatron's even split of `layers` over `pp` stages: (layers on each of the first pp-1,
    layers on the last). The first stages hold ceil(layers/pp), the last the rest, or floor
    where ceil would leave the last none (8 layers on 6 stages are 1,1,1,1,1,3; what
    --decoder-last-pipeline-num-layers states)."""
    per = np.ceil(layers / pp)
    per = np.where(layers - (pp - 1) * per < 1, np.floor(layers / pp), per)
    return per, layers - (pp - 1) * per


def interleaves_by_counting_ends(layers: Col, pp: Col, vp: Col) -> Col:
    """Interleaved layouts whose pp*vp chunks the layers alone do not fill evenly but the
    layers plus the embedding and the loss, counted as a layer each, do: what Megatron-Core
    asks of --account-for-embedding/loss-in-pipeline-split with virtual stages ((layers + 2)
    divisible by pp, and by vp per rank: megatron-core 0.16.1 transformer_config.py). Llama 3
    405B's 126 layers on 16 stages interleave this way (Llama 3 paper, Sec. 3.3.2: one layer
    fewer on the first and the last stage)."""
    chunks = np.asarray(pp, float) * np.asarray(vp, float)
    layers = np.asarray(layers, float)
    interleaved = (np.asarray(vp) > 1) & (np.asarray(pp) > 1)
    return interleaved & (layers % chunks != 0) & ((layers + 2.0) % chunks == 0)


def counts_ends(x: CostInputs) -> Col:
    """Layouts whose split counts the embedding and the LM head as a layer each: the
    framework's own split, or one it is told to use so that an interleaved layout divides."""
    asked = (x.ends_split_to_interleave > 0) & interleaves_by_counting_ends(x.layers, x.pp, x.vp)
    return (x.ends_split > 0) | (asked & (x.balanced_split == 0))


def splits_by_cost(x: CostInputs) -> Col:
    """Layouts whose pipeline the framework splits by its compute-cost estimate."""
    return (x.cost_split > 0) & (x.pp > 1) & (x.vp == 1)


class CostSplit(NamedTuple):
    """A pipeline cut by compute cost: layers on the first rank, the rank holding the LM head
    and the layers on that rank."""

    first: Col
    head_rank: Col
    head_layers: Col


def cost_split_layers(
    layers: Col, hidden: Col, ffn: Col, vocab: Col, pp: Col, gated: Col
) -> CostSplit:
    """nanotron's pipeline split (models/base.py build_model): blocks in order, a layer
    costing 4 h^2 + 3 ffn h (gated MLP; 2 ffn h otherwise, models/starcoder2.py) and the LM
    head vocab h, go to the current rank, which moves on once the running total passes its
    threshold (r + 1) / pp of the whole. So a rank also takes the block that crosses its
    threshold, and the head, worth several layers, leaves fewer on its rank.

    Integer arithmetic (exact in float64 below 2^53): the Playbook's 8B model on 32 stages sits
    exactly on a threshold, which a rounded share puts on the wrong side."""
    layer = 4.0 * hidden**2 + np.where(gated, 3.0, 2.0) * ffn * hidden
    whole, per_rank = layers * layer + vocab * hidden, pp * layer  # a rank's share: whole/per_rank
    first = np.minimum(np.floor_divide(whole, per_rank) + 1.0, layers)
    # The head's rank: how many thresholds the layers' running total passed (ceil(L/share) - 1).
    head_rank = -np.floor_divide(-layers * per_rank, whole) - 1.0
    before = np.minimum(np.floor_divide(head_rank * whole, per_rank) + 1.0, layers)
    return CostSplit(first, head_rank, layers - np.where(head_rank > 0, before, 0.0))


def _by_framework(x: CostInputs, even: Col, part: str) -> Col:
    """`even` where layers split evenly, else the compute-cost split's `part` (a CostSplit
    field). The split is solved only when some layout needs it: the search evaluates millions
    of even ones."""
    if not np.any(x.cost_split > 0):
        return even
    return np.where(splits_by_cost(x), getattr(x.cost_split_stages, part), even)


def stage_layers(x: CostInputs) -> Col:
    """Layers on the busiest pipeline rank of each layout (the first rank where the framework
    splits by compute cost)."""
    return _by_framework(x, busiest_rank_layers(x.layers, x.pp, x.vp), "first")


def last_stage_layers(x: CostInputs) -> Col:
    """Layers on the pipeline rank that also holds the LM head."""
    return _by_framework(x, busiest_rank_layers(x.layers, x.pp, x.vp), "head_layers")


def last_stage_rank(x: CostInputs) -> Col:
    """The pipeline rank that holds the LM head: the last, or where the framework's
    compute-cost split puts it (nanotron leaves later ranks the cast and the loss, or idle)."""
    return _by_framework(x, x.pp - 1.0, "head_rank")


def recomputed_layers(x: CostInputs, per_stage: Col) -> Col:
    """Layers of a stage fully recomputed: recompute_layers of them with full recompute (0, or
    every layer of an even split, meaning all), none otherwise."""
    every = busiest_rank_layers(x.layers, x.pp, x.vp)
    some = (x.recompute_layers > 0) & (x.recompute_layers < every)
    count = np.where(some, np.minimum(x.recompute_layers, per_stage), per_stage)
    return np.where(x.recompute == FULL, count, 0.0)
