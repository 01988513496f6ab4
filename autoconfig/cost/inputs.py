"""The cost model's input: one numpy column per quantity, N candidate configurations at once.

Specs (pydantic) are turned into these columns once; every cost function then reads plain
arrays, and a scalar broadcasts against arrays, so a search over one model passes the model's
figures as scalars and only the layout columns as arrays.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields

import numpy as np

from autoconfig.specs import ClusterSpec, GPUSpec, ModelSpec

Col = np.ndarray

# float32 halves the memory traffic of an exhaustive search; 7 significant digits are far
# finer than the model's accuracy.
DTYPE = np.float32

RECOMPUTE_CODES = {"none": 0, "selective": 1, "full": 2, "op": 3}
MLP_CODES = {"gelu": 0, "swiglu": 1, "squared_relu": 2}


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
    max_seq: Col
    dropout: Col
    experts: Col
    topk: Col
    expert_ffn: Col
    shared_experts: Col
    # hardware
    peak_flops: Col  # FLOP/s at the run's precision
    hbm_bytes_s: Col
    memory_gb: Col
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
    mem_reserved_gb: Col
    gpus_per_node: Col
    intra_bytes_s: Col
    inter_bytes_s: Col
    # layout
    dp: Col
    tp: Col
    pp: Col
    vp: Col
    cp: Col
    ep: Col
    sp: Col
    mbs: Col
    gbs: Col
    seq: Col
    recompute: Col
    recompute_layers: Col  # layers per stage fully recomputed (full recompute only)
    zero: Col
    fp8: Col
    flash: Col
    overlap_grad_reduce: Col
    # 1 where SP's all-gathered block inputs are saved for backward (torch DTensor, the
    # bundled trainer); 0 where only the shard is and backward re-gathers (Megatron-LM).
    sp_saves_gathered: Col
    peak_bf16_flops: Col  # MFU is quoted against the bf16 peak for every precision

    @property
    def n(self) -> int:
        shapes = [np.shape(getattr(self, f.name)) for f in fields(self)]
        return int(np.prod(np.broadcast_shapes(*shapes)))

    @classmethod
    def from_columns(cls, cols: Mapping[str, object]) -> CostInputs:
        """Builds from a mapping of column name -> scalar or array. Missing names raise,
        except the framework-behaviour flags, which default to Megatron-LM's
        (OPTIONAL_COLUMNS)."""
        cols = {**OPTIONAL_COLUMNS, **cols}
        values = {}
        for f in fields(cls):
            if f.name not in cols:
                raise KeyError(f"cost input column '{f.name}' is missing")
            values[f.name] = np.asarray(cols[f.name], dtype=DTYPE)
        return cls(**values)


# Framework-behaviour flags and their Megatron-LM values (overlapped gradient reduction,
# sequence parallelism saving only the shard).
OPTIONAL_COLUMNS = {"overlap_grad_reduce": 1.0, "sp_saves_gathered": 0.0}


def model_columns(model: ModelSpec) -> dict[str, float]:
    """Architecture figures of one catalog model as scalar columns."""
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
        "mlp_kind": MLP_CODES[model.mlp],
        "learned_pos": float(model.position == "learned"),
        "max_seq": model.max_seq_len or model.seq_len,
        "dropout": float(model.dropout),
        "experts": model.num_experts,
        "topk": model.topk,
        "expert_ffn": model.expert_ffn,
        "shared_experts": model.shared_experts,
    }


def hardware_columns(gpu: GPUSpec, cluster: ClusterSpec, precision: str) -> dict[str, float]:
    """Datasheet figures and efficiency constants of one GPU type and cluster."""
    e = gpu.efficiency
    return {
        "peak_flops": gpu.peak(precision) * 1e12,
        "peak_bf16_flops": gpu.peak("bf16") * 1e12,
        "hbm_bytes_s": gpu.memory_tb_s * 1e12,
        "memory_gb": gpu.memory_gb,
        "eff_gemm": (e.gemm_fp8 or e.gemm) if precision == "fp8" else e.gemm,
        "eff_attention": e.attention,
        "eff_memory": e.memory,
        "kernel_s": e.kernel_us * 1e-6,
        "eff_intra": e.intra_node_bus,
        "eff_inter": e.inter_node_bus,
        "lat_intra_s": e.intra_node_latency_us * 1e-6,
        "lat_inter_s": e.inter_node_latency_us * 1e-6,
        "step_overhead_s": e.step_overhead_ms * 1e-3,
        "mem_overhead": e.memory_overhead,
        "mem_reserved_gb": e.memory_reserved_gb,
        "gpus_per_node": cluster.gpus_per_node,
        "intra_bytes_s": cluster.intra_node_gb_s * 1e9,
        "inter_bytes_s": cluster.inter_node_gb_s * 1e9,
    }


def stage_layers(x: CostInputs) -> Col:
    """Layers on the busiest pipeline rank: uneven splits put the extra layer on some ranks."""
    return np.ceil(x.layers / (x.pp * x.vp)) * x.vp
