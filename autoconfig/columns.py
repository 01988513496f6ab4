"""From typed specs to the cost model's columns: the one builder of CostInputs (training) and
ServeInputs (serving). Search, estimate, batch rows, the measured search, calibration and the
trainer's own prediction all build their inputs here, so they cannot disagree.

A model or a GPU is given once for all layouts (a search) or once per row (a table of runs:
each distinct spec is turned into columns once and scattered to its rows).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, fields
from typing import TypeVar

import numpy as np
import pandas as pd

from autoconfig import catalog, layout
from autoconfig.cost.inference import ServeInputs
from autoconfig.cost.inputs import CostInputs
from autoconfig.specs import ClusterSpec, GPUSpec, InferenceEfficiency, ModelSpec
from autoconfig.vocab import KvPrecision, Position, Precision, ServePrecision

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
    """What the training framework does that changes the cost (scalars or one value per row):
    flash attention; gradient reduction overlapped with backward; sequence parallelism saving
    its all-gathered block inputs for backward (torch DTensor, the bundled trainer) rather than
    the shard (Megatron-LM). Megatron-LM's choices are the defaults."""

    flash_attention: Values = 1.0
    overlap_grad_reduce: Values = 1.0
    sp_saves_gathered: Values = 0.0

    def columns(self) -> dict[str, Values]:
        return {
            "flash": self.flash_attention,
            "overlap_grad_reduce": self.overlap_grad_reduce,
            "sp_saves_gathered": self.sp_saves_gathered,
        }


def model_columns(model: ModelSpec) -> dict[str, float]:
    """Architecture figures of one model as scalar columns."""
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
        "shared_experts": model.shared_experts,
    }


def hardware_columns(hw: Hardware) -> dict[str, float]:
    """Datasheet figures and efficiency constants of one GPU type, cluster and precision."""
    gpu, e = hw.gpu, hw.gpu.efficiency
    fp8 = str(hw.precision) == Precision.FP8.value
    return {
        "peak_flops": gpu.peak(str(hw.precision)) * 1e12,
        "peak_bf16_flops": gpu.peak("bf16") * 1e12,
        "hbm_bytes_s": gpu.memory_tb_s * 1e12,
        "memory_gb": gpu.memory_gb,
        "eff_gemm": (e.gemm_fp8 or e.gemm) if fp8 else e.gemm,
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
        "gpus_per_node": hw.cluster.domain,  # GPUs that reach each other over NVLink
        "intra_bytes_s": hw.cluster.intra_node_gb_s * 1e9,
        "inter_bytes_s": hw.cluster.inter_node_gb_s * 1e9,
        "fp8": float(fp8),
    }


def serving_constant_columns(e: InferenceEfficiency) -> dict[str, float]:
    return {
        "eff_memory": e.memory,
        "eff_gemm": e.gemm,
        "kernel_s": e.kernel_us * 1e-6,
        "ar_base_s": e.allreduce_base_us * 1e-6,
        "ar_step_s": e.allreduce_step_us * 1e-6,
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
    (numbers), precision (a vocab.ServePrecision value: the weights), kv_precision (resolved,
    not auto) and optionally the continuous-batching columns of CONTINUOUS_DEFAULTS. A replica
    is the training layout's single data-parallel copy at the input length, with the batch as
    one micro-batch and nothing sharded beyond tp and pp."""
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
        **{k: np.asarray(v, float) for k, v in constants.items() if k in names},
    )


def _activation_bytes(weights: ServePrecision) -> float:
    """Bytes of one GEMM input element: quantised with the weights for fp8/nvfp4, else the
    16-bit (or fp32) activations."""
    if weights in (ServePrecision.FP8, ServePrecision.NVFP4):
        return weights.bytes
    return 4.0 if weights is ServePrecision.FP32 else 2.0
