"""From typed specs to the cost model's columns: the one builder of CostInputs (training) and
ServeInputs (serving). Search, estimate, batch rows, the measured search, calibration and the
trainer's own prediction all build their inputs here, so they cannot disagree.

A model or a GPU is given once for all layouts (a search) or once per row (a table of runs:
each distinct spec is turned into columns once and scattered to its rows).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, TypeVar

import numpy as np
import pandas as pd

from autoconfig.columns import kernel_index
from autoconfig.cost import host
from autoconfig.cost.inputs import CostInputs
from autoconfig.spec import catalog, layout
from autoconfig.spec.schema import ClusterSpec, GPUSpec, InferenceEfficiency, ModelSpec
from autoconfig.spec.vocab import KvPrecision, Position, Precision, ServePrecision

if TYPE_CHECKING:
    from autoconfig.cost.inference import ServeInputs

T = TypeVar("T")
Values = float | np.ndarray


@dataclass(frozen=True)
class Hardware:
    """A GPU type in a cluster, running at a training precision."""

    gpu: GPUSpec
    cluster: ClusterSpec
    precision: str = Precision.BF16.value

    def key(self) -> Hashable:
        return (id(self.gpu), self.cluster, str(self.precision))


@dataclass(frozen=True)
class Behaviour:
    """What the training framework does that changes the cost (scalars or one value per row);
    the defaults are Megatron-LM's plain settings. Frameworks set these from their profiles
    (autoconfig.columns.frameworks), each with its source."""

    flash_attention: Values = 1.0
    overlap_grad_reduce: Values = 1.0  # gradient reduction overlapped with backward
    overlap_param_gather: Values = 0.0  # ZeRO-1/2 weight all-gather overlapped with forward
    tp_overlap: Values = 0.0  # TP collectives overlapped with their GEMMs (needs SP)
    p2p_overlap: Values = 0.0  # pipeline sends overlapped with compute (when interleaved)
    cuda_graphs: Values = 0.0  # kernel launches replayed from captured graphs
    fused_kernels: Values = 0.0  # fused activation kernels (SwiGLU saves only its input)
    ep_dedup: Values = 0.0  # MoE dispatch sends each token once per node (DeepEP, HybridEP)
    param_bytes: Values = 2.0  # working weight copy: 2 (bf16), 1 (fp8 parameters)
    grad_comm_bytes: Values = 4.0  # gradients reduced in fp32 (4) or bf16 (2)
    optim_bytes: Values = 12.0  # fp32 master weights + fp32 Adam moments
    # lighter Adam state keeps fp32 main parameters as 16-bit remainders (cost.optimizer)
    main_param_remainders: Values = 0.0
    # CPU offload (cost.offload): bytes per parameter the host sends up, and how the host
    # copies overlap (schema.OFFLOAD_OVERLAPS index: 0 none, 1 with the CPU step, 2 with the
    # backward and forward)
    offload_upload_bytes: Values = 2.0
    offload_overlap: Values = 0.0
    # activation offload (cost.activation_offload): layers whose saved activations stay on the GPU
    act_offload_resident: Values = 2.0
    sp_saves_gathered: Values = 0.0  # SP keeps the all-gathered block inputs (torch DTensor)
    cost_split: Values = 0.0  # pipeline blocks placed by the framework's compute-cost estimate
    balanced_split: Values = 0.0  # stages balanced by hand against the embedding and LM head
    ends_split: Values = 0.0  # the embedding and LM head each count as a layer in the split
    # ... where that lets an interleaved layout divide, when the framework can be told to
    ends_split_to_interleave: Values = 0.0
    # torch.autocast over fp32 weights (the bundled trainer on GPU): the residual stream and the
    # norms stay fp32 and each linear casts its own bf16 copy of its input
    autocast_fp32: Values = 0.0
    # 1 where RMSNorm runs as eager tensor ops, not one fused kernel (the bundled trainer's
    # autograd function: cost.layer.eager_norm_passes)
    eager_rmsnorm: Values = 0.0
    # 1 where a step pays the profile's fitted step_overhead_ms (the published frameworks' host
    # work per step); 0 where the framework's fixed cost per step was measured to be its
    # optimizer's passes alone (the bundled trainer on one GPU: docs/gpu_measurements.md)
    profile_step_overhead: Values = 1.0
    # 1 where the optimizer frees the gradients after each step (torch's zero_grad with
    # set_to_none, the bundled trainer) and nothing else holds them (no DDP buckets): a step of
    # one micro-batch then never holds all its gradients beside all its activations
    # (cost.memory.gradients_at_peak)
    grads_freed_each_step: Values = 0.0
    # Bytes moved per parameter of a rank to accumulate its weight gradient outside the
    # weight-gradient GEMM: in every micro-batch (a cast or an add into a zeroed fp32 buffer),
    # and in every micro-batch but the first (autograd adding into the gradient it holds).
    # Megatron's fused accumulation (the GEMM adds into fp32 main_grad) moves none.
    grad_pass_bytes: Values = 0.0
    grad_accumulate_bytes: Values = 0.0
    # The ZeRO stages below 3 whose gradients are reduced in every micro-batch's backward, not
    # held to the last one's (FSDP's reduce-scatter, DeepSpeed's ZeRO-2), as bits: 1 << stage
    # (`reduce_bits`). ZeRO-3 reduce-scatters every micro-batch whatever this says, and under a
    # pipeline schedule every stage reduces once a step.
    reduce_every_micro_batch: Values = 0.0
    # 1 where ZeRO-2 reshards the weights after each backward (FSDP2's reshard_after_backward,
    # FSDP1's SHARD_GRAD_OP under gradient sync), so every micro-batch gathers them again;
    # DeepSpeed's ZeRO-2 keeps whole weights and gathers the updated shards once a step.
    zero2_gathers_every_micro_batch: Values = 0.0
    # The ZeRO stages whose gradients are reduced only after the whole backward, with nothing
    # left to hide behind, as bits (`reduce_bits`): without a pipeline (the bundled trainer's
    # ZeRO-1 reduce-scatters in its optimizer step) and under one (torch.distributed.pipelining
    # reduces a stage's FSDP gradients after its last backward, DeepSpeed's pipeline engine in
    # a ReduceGrads instruction after the last one).
    reduce_after_backward: Values = 0.0
    pipeline_reduce_after_backward: Values = 0.0
    # 1 where FSDP's ZeRO-2/3 copies on the compute stream: every all-gather's output out into
    # the per-parameter weights (read and written), every gradient into the reduce-scatter's
    # input in the reduction dtype (torch's fully_shard, _fsdp_collectives.py).
    fsdp_copies: Values = 0.0
    # 1 where a bf16 run at ZeRO 0/1 uses DeepSpeed's BF16_Optimizer: `bf16_pass_bytes` per
    # parameter in every micro-batch into its own gradient copy, and a whole all-reduce of it
    # before the sharded step instead of a reduce-scatter.
    bf16_optimizer: Values = 0.0
    p2p_serial: Values = 0.0  # a stage's pipeline sends and receives one at a time, blocking
    bf16_pass_bytes: Values = 0.0
    # The run's task (spec.task.TaskSpec.columns: vocab.Task and vocab.LoraTargets codes, the
    # adapters' rank): what the framework is asked to train, pretraining by default.
    task: Values = 0.0
    lora_rank: Values = 0.0
    lora_targets: Values = 0.0
    # The documents the sequences hold (spec.documents): packed documents' E[l^2]/E[l] (0: one
    # document a sequence) and the share of tokens that are not padding.
    doc_len: Values = 0.0
    useful_share: Values = 1.0
    # Packed documents as (length, share of documents) rows (spec.task.TaskSpec.doc_classes):
    # not a column; dynamic context parallelism times each (cost.hybrid_cp).
    doc_classes: np.ndarray = field(default_factory=lambda: np.zeros((0, 2)))

    def columns(self) -> dict[str, Values]:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "doc_classes"}
        out["flash"] = out.pop("flash_attention")
        return out


def reduce_bits(stages: Sequence[int]) -> float:
    """The ZeRO `stages` as bits (1 << stage), for Behaviour's per-stage columns
    (reduce_every_micro_batch, reduce_after_backward, pipeline_reduce_after_backward)."""
    return float(sum(1 << int(stage) for stage in set(stages)))


def model_columns(model: ModelSpec) -> dict[str, float]:
    """Architecture figures of one model as scalar columns."""
    mla, mamba = model.mla, model.mamba
    moe_share = model.moe_layers / model.ffn_layers if model.ffn_layers else 0.0
    return {
        "layers": model.layers,
        "hidden": model.hidden,
        "heads": model.heads,
        "kv_heads": model.kv,
        "head_dim": model.dhead,
        "ffn": model.ffn,
        "vocab": model.vocab,
        "tied": float(model.tied_embeddings),
        "layernorm": float(model.norm == "layernorm"),
        "mlp_kind": float(model.mlp.code),
        "learned_pos": float(model.position == Position.LEARNED),
        "rope": float(model.position == Position.ROPE),
        "max_seq": model.max_seq_len or model.seq_len,
        "dropout": float(model.dropout),
        "experts": model.num_experts,
        "topk": model.topk,
        "expert_ffn": model.expert_ffn,
        "shared_ffn": model.shared_ffn if model.is_moe else 0.0,
        "moe_latent": float(model.moe_latent or 0),
        "attn_share": model.attn_layers / model.layers,
        "mlp_share": model.ffn_layers / model.layers,
        "moe_share": moe_share,
        "mamba_share": (mamba.layers / model.layers) if mamba else 0.0,
        "q_lora": float(mla.q_lora_rank) if mla else 0.0,
        "kv_lora": float(mla.kv_lora_rank) if mla else 0.0,
        "rope_dim": float(mla.rope_head_dim) if mla else 0.0,
        "v_dim": float(mla.v_head_dim) if mla else 0.0,
        "window": float(model.sliding_window or 0),
        "window_share": model.sliding_window_layers / model.attn_layers
        if model.sliding_window and model.attn_layers
        else 0.0,
        "mamba_heads": float(mamba.heads) if mamba else 0.0,
        "mamba_head_dim": float(mamba.head_dim) if mamba else 0.0,
        "mamba_state": float(mamba.state) if mamba else 0.0,
        "mamba_groups": float(mamba.groups) if mamba else 0.0,
        "mtp": float(model.mtp_layers),
    }


# Bytes per GEMM operand element: 16-bit, per-tensor or block-scaled 8-bit, and nvfp4's 4-bit
# values with one fp8 scale per 16 (NVIDIA, "Introducing NVFP4", 2025).
GEMM_BYTES = {
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "mxfp8": 1.0 + 1.0 / 32,
    "nvfp4": 0.5 + 1.0 / 16,
}


def hardware_columns(hw: Hardware) -> dict[str, float]:
    """Datasheet figures and efficiency constants of one GPU type, cluster and precision."""
    gpu, e = hw.gpu, hw.gpu.efficiency
    precision = str(hw.precision)
    return {
        "peak_flops": gpu.peak(precision) * 1e12,
        "peak_bf16_flops": gpu.peak("bf16") * 1e12,
        "hbm_bytes_s": gpu.memory_tb_s * 1e12,
        "sms": float(gpu.sms),
        "memory_gib": gpu.memory_gib,
        "eff_gemm": e.gemm_at(precision),
        "eff_attention": e.attention,
        "eff_memory": e.memory,
        "kernel_s": e.kernel_us * 1e-6,
        "eff_intra": e.intra_node_bus,
        "eff_inter": e.inter_node_bus,
        "lat_intra_s": e.intra_node_latency_us * 1e-6,
        "lat_inter_s": e.inter_node_latency_us * 1e-6,
        "step_overhead_s": e.step_overhead_ms * 1e-3,
        "mem_overhead": e.memory_overhead,
        "mem_reserved_gib": e.memory_reserved_gib,
        "gpus_per_node": hw.cluster.domain,  # GPUs that reach each other over NVLink
        "intra_bytes_s": hw.cluster.intra_node_gb_s * 1e9,
        "inter_bytes_s": hw.cluster.inter_node_gb_s * 1e9,
        "gemm_bytes": GEMM_BYTES.get(precision, 2.0),
        # the host side (cost.host): link and DRAM bytes/s per GPU, host memory per GPU (NaN
        # where the cluster profile does not state it)
        "host_link_bytes_s": host.host_link_gb_s(gpu.name, gpu.chip) * 1e9,
        "host_dram_bytes_s": host.host_dram_gb_s(gpu.name, gpu.chip) * 1e9,
        "host_memory_gib": (
            hw.cluster.host_memory_gib / hw.cluster.gpus_per_node
            if hw.cluster.host_memory_gib
            else np.nan
        ),
        "kernel_chip": float(kernel_index.table_code(gpu)),
    }


def serving_constant_columns(e: InferenceEfficiency) -> dict[str, float]:
    return {
        "eff_memory": e.memory,
        "eff_gemm": e.gemm,
        "kernel_s": e.kernel_us * 1e-6,
        "ar_base_s": e.allreduce_base_us * 1e-6,
        "ar_step_s": e.allreduce_step_us * 1e-6,
        "iteration_s": e.iteration_us * 1e-6,
        "sequence_s": e.sequence_us * 1e-6,
    }


def per_row(
    items: T | Sequence[T],
    columns_of: Callable[[T], dict[str, float]],
    key: Callable[[T], Hashable],
) -> dict[str, Values]:
    """Columns of one item (scalars), or of one item per row (each distinct item once)."""
    if not isinstance(items, Sequence) or isinstance(items, str):
        return dict(columns_of(items))  # type: ignore[arg-type]
    index: dict[Hashable, int] = {}
    firsts: list[T] = []
    rows = np.empty(len(items), dtype=int)
    for i, item in enumerate(items):
        k = key(item)
        if k not in index:
            index[k] = len(firsts)
            firsts.append(item)
        rows[i] = index[k]
    table = pd.DataFrame([columns_of(item) for item in firsts])
    return {c: table[c].to_numpy(float)[rows] for c in table.columns}


def training_inputs(
    models: ModelSpec | Sequence[ModelSpec],
    hardware: Hardware | Sequence[Hardware],
    layouts: pd.DataFrame,
    gbs: Values,
    seq_len: Values,
    behaviour: Behaviour = Behaviour(),
) -> CostInputs:
    """Cost-model columns for training `layouts` (one column per layout dimension)."""
    cols: dict[str, object] = {
        **per_row(models, model_columns, lambda m: m),
        **per_row(hardware, hardware_columns, Hardware.key),
        **layout.columns(layouts),
        **behaviour.columns(),
        "gbs": np.asarray(gbs, float),
        "seq": np.asarray(seq_len, float),
        "kernels": kernel_index.kernel_set(),
        "doc_classes": behaviour.doc_classes,
    }
    return CostInputs.from_columns(cols)


def training_inputs_of(
    model: ModelSpec, hardware: Hardware, run: layout.Layout, gbs: int, seq_len: int, **behaviour
) -> CostInputs:
    """One layout's inputs (N = 1)."""
    return training_inputs(
        model, hardware, layout.frame_of(run.model_dump()), gbs, seq_len, Behaviour(**behaviour)
    )


# -- serving -------------------------------------------------------------------------------------

SERVING_COLUMNS = ("tp", "pp", "batch_size", "input_len", "output_len", "replicas")
"""What a serving deployment table holds (plus `precision` and `kv_precision` values)."""

CONTINUOUS_DEFAULTS = {
    "ep": 1.0,
    "max_seqs": 256.0,
    "max_tokens": 8192.0,
    "kv_fraction": 0.9,
    "block_tokens": 16.0,
    "engine": 1.0,  # cost.inference.SERVING_ENGINES: vLLM
}
"""Continuous-batching columns a deployment table may add (ServeInputs' defaults)."""

# The tensor-core format a serving precision computes in: fp8 and nvfp4 checkpoints quantise
# activations too; weight-only int8/int4 dequantise to 16-bit before the GEMM.
_COMPUTE = {"fp8": Precision.FP8, "nvfp4": Precision.NVFP4, "fp32": Precision.BF16}


def serving_compute(precision: str) -> Precision:
    return _COMPUTE.get(str(precision), Precision.FP16)


def serving_inputs(
    models: ModelSpec | Sequence[ModelSpec],
    gpus: tuple[GPUSpec, ClusterSpec] | Sequence[tuple[GPUSpec, ClusterSpec]],
    deployments: pd.DataFrame,
    flash_attention: Values = 1.0,
) -> ServeInputs:
    """Serving columns for `deployments`: tp, pp, batch_size, input_len, output_len, replicas
    (numbers; etp optional, tp when absent), precision (a vocab.ServePrecision value: the
    weights), kv_precision (resolved, not auto) and optionally the continuous-batching columns
    of CONTINUOUS_DEFAULTS. A replica is the training layout's single data-parallel copy at the
    input length, with the batch as one micro-batch and nothing sharded beyond tp (experts by
    etp) and pp."""
    # Imported here: a training search never builds serving inputs and need not load them.
    from autoconfig.cost.inference import ServeInputs

    d = deployments
    compute = [serving_compute(p) for p in d["precision"].astype(str)]
    n = len(d)
    pairs = [gpus] * n if isinstance(gpus, tuple) else list(gpus)
    hardware = [
        Hardware(g, c, (p if g.supports(p.value) else Precision.FP16).value)
        for (g, c), p in zip(pairs, compute, strict=True)
    ]
    ones = np.ones(n)
    replica = pd.DataFrame(
        {
            **{dim.name: np.full(n, dim.plain(dim.default)) for dim in layout.DIMENSIONS},
            "tp": d["tp"].to_numpy(),
            # Serving engines split every expert over the tp ranks (or, with expert
            # parallelism, the experts themselves): a rank holds and computes 1/tp of them,
            # unless the deployment states its own etp (the bundled generator's whole experts).
            "etp": (d["etp"] if "etp" in d else d["tp"]).to_numpy(),
            "pp": d["pp"].to_numpy(),
            "mbs": d["batch_size"].to_numpy(),
            "sp": np.zeros(n, bool),
            "zero": np.zeros(n, int),
        }
    )
    x = training_inputs(
        models,
        hardware,
        replica,
        d["batch_size"].to_numpy(float),
        d["input_len"].to_numpy(float),
        Behaviour(flash_attention=flash_attention, overlap_grad_reduce=ones),
    )
    constants = per_row(
        [g for g, _ in pairs],
        lambda g: serving_constant_columns(catalog.serving_constants(g)[0]),
        id,
    )
    names = {f.name for f in fields(ServeInputs)}
    weights = [ServePrecision(str(p)) for p in d["precision"]]
    act = [_activation_bytes(w) for w in weights]
    continuous = {
        k: (d[k].to_numpy(float) if k in d else np.full(n, v))
        for k, v in CONTINUOUS_DEFAULTS.items()
    }
    graph_tokens, graph_prefill = engine_graphs(continuous["engine"])
    return ServeInputs(
        x=x,
        batch=d["batch_size"].to_numpy(float),
        input_len=d["input_len"].to_numpy(float),
        output_len=d["output_len"].to_numpy(float),
        weight_bytes=np.array([w.bytes for w in weights], float),
        kv_bytes=d["kv_precision"].map(lambda p: KvPrecision(str(p)).bytes).to_numpy(float),
        replicas=d["replicas"].to_numpy(float),
        act_bytes=np.array(act, float),
        **continuous,
        graph_tokens=graph_tokens,
        graph_prefill=graph_prefill,
        **{k: np.asarray(v, float) for k, v in constants.items() if k in names},
    )


def engine_graphs(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per engine code (cost.inference.SERVING_ENGINES), the largest iteration its CUDA graphs
    capture by default and whether iterations with prefill tokens replay graphs too, from the
    engine profiles (spec/engines.py); a library runtime captures none."""
    from autoconfig.cost.inference import SERVING_ENGINES
    from autoconfig.spec.engines import engine

    tokens, prefill = np.zeros(len(codes)), np.zeros(len(codes))
    for code in np.unique(codes):
        name = SERVING_ENGINES[int(code)]
        if name == "library":
            continue
        graphs = engine(name).cuda_graphs
        rows = codes == code
        tokens[rows] = float(str(graphs.max_capture_size.value))  # a whole number (validated)
        prefill[rows] = float(graphs.covers.value != "decode")
    return tokens, prefill


def _activation_bytes(weights: ServePrecision) -> float:
    """Bytes of one GEMM input element: quantised with the weights for fp8/nvfp4, else the
    16-bit (or fp32) activations."""
    if weights in (ServePrecision.FP8, ServePrecision.NVFP4):
        return weights.bytes
    return 4.0 if weights is ServePrecision.FP32 else 2.0
