"""Reads a table of serving points (inference_runs.csv's columns, as text) into typed specs:
one ModelSpec, GPU and deployment per row, with the first error of each row. Architecture
columns are read exactly as for training runs (autoconfig.rows.training); the serving columns are
batch_size, input_len, output_len, tp, pp, num_gpus (GPUs of the whole deployment; replicas =
num_gpus / (tp*pp), or a `replicas` column), precision (vocab.ServePrecision: the weights;
fp32 for CPU trials) and an optional kv_precision (auto = the weights' 16-bit type).

`batching` (vocab.Batching; blank = static, TensorRT-LLM's "inflight" = continuous) picks the
model: a static row needs batch_size; a continuous row is predicted at maximum load, its
running batch chosen by the K/V cache and the optional max_num_seqs, max_num_batched_tokens,
kv_cache_fraction (of the memory left after weights), kv_block_tokens and ep columns."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from autoconfig.base.errors import UserError
from autoconfig.columns.build import CONTINUOUS_DEFAULTS, serving_inputs
from autoconfig.cost.inference import SERVING_ENGINES, ServeInputs
from autoconfig.rows.training import (
    PLACEHOLDER_MODEL,
    Errors,
    add_row_errors,
    fill_from_catalog,
    flag,
    integers,
    read_gpus,
    read_models,
    text_column,
)
from autoconfig.spec import engines, layout
from autoconfig.spec.schema import ClusterSpec, GPUSpec, ModelSpec
from autoconfig.spec.vocab import Batching, KvPrecision, ServePrecision

REQUIRED = ("input_len", "output_len", "tp", "pp", "gpu")
ARCH_REQUIRED = ("layers", "hidden", "heads", "vocab")
SERVING_INTS = ("batch_size", "input_len", "output_len", "replicas")
# Continuous-batching engine settings: CSV column -> deployment column (columns.py).
ENGINE_INTS = {
    "max_num_seqs": "max_seqs",
    "max_num_batched_tokens": "max_tokens",
    "kv_block_tokens": "block_tokens",
    "ep": "ep",
}


# A row's framework -> its serving engine (cost.inference.SERVING_ENGINES); anything else
# (FasterTransformer, Megatron-LM, a blank cell) is a library runtime.
_ENGINES = {
    "tensorrt-llm": "trtllm",
    "trtllm": "trtllm",
    "vllm": "vllm",
    "sglang": "sglang",
}


def engine_code(framework: pd.Series) -> np.ndarray:
    """Per row, the index in SERVING_ENGINES of the engine its framework names."""
    names = framework.str.strip().str.lower().map(_ENGINES).fillna("library")
    return names.map(SERVING_ENGINES.index).to_numpy(float)


@dataclass
class ServingRows:
    models: list[ModelSpec]
    gpus: list[tuple[GPUSpec, ClusterSpec]]
    deployments: pd.DataFrame  # tp, pp, batch_size, input_len, output_len, replicas, precisions
    flash: np.ndarray
    errors: pd.Series
    resolved: pd.DataFrame

    def inputs(self) -> ServeInputs:
        return serving_inputs(self.models, self.gpus, self.deployments, self.flash)

    @property
    def continuous(self) -> np.ndarray:
        return (self.resolved["batching"] == Batching.CONTINUOUS.value).to_numpy()


def read_serving_rows(df: pd.DataFrame) -> ServingRows:
    for col in REQUIRED:
        if col not in df:
            raise UserError(f"runs: missing required column '{col}'")
    df = fill_from_catalog(df.reset_index(drop=True))
    err = Errors(df.index)
    add_row_errors(df, err)  # a row with more cells than the header (fileio.csv_rows)
    serving = integers(
        df,
        err,
        required=REQUIRED,
        positive=(*SERVING_INTS, "tp", "pp", "num_gpus", *ENGINE_INTS),
    ).drop(columns=["num_experts", "topk", "shared_experts", "recompute_layers"])
    batching = text_column(df, "batching").replace({"": Batching.STATIC.value})
    known = batching.str.lower().isin([*Batching.values(), "inflight", "in-flight"])
    err.add(~known, f"batching: must be {Batching.allowed()} (or inflight)")
    batching = batching.where(~known, batching.map(lambda b: Batching.parse(b, "batching").value))
    continuous = batching == Batching.CONTINUOUS.value
    err.add(
        ~continuous & serving["batch_size"].isna(),
        "batch_size: required for a static batch, must be a positive integer",
    )
    fraction = pd.to_numeric(text_column(df, "kv_cache_fraction").replace({"": None}))
    fraction_text = text_column(df, "kv_cache_fraction")
    bad_fraction = (fraction_text != "") & ~((fraction > 0) & (fraction <= 1))
    err.add(bad_fraction, "kv_cache_fraction: must be a number in (0, 1]")
    tp, pp = serving["tp"].fillna(1), serving["pp"].fillna(1)
    per_replica = tp * pp
    replicas_given = serving["replicas"]
    num_gpus = serving["num_gpus"].fillna(replicas_given.fillna(1) * per_replica)
    replicas = replicas_given.fillna(num_gpus / per_replica)
    err.add(
        replicas * per_replica != num_gpus,
        "num_gpus: must be a multiple of tp*pp (replicas = num_gpus / (tp*pp))",
    )
    precision = text_column(df, "precision").replace({"": "fp16"})
    err.add(
        ~precision.isin(ServePrecision.values()), f"precision: must be {ServePrecision.allowed()}"
    )
    kv = text_column(df, "kv_precision").replace({"": "auto"})
    err.add(~kv.isin(KvPrecision.values()), f"kv_precision: must be {KvPrecision.allowed()}")
    weights = precision.where(precision.isin(ServePrecision.values()), "fp16")
    kv = kv.where(kv.isin(KvPrecision.values()), "auto")
    kv = pd.Series(
        [KvPrecision(k).resolve(ServePrecision(w)).value for k, w in zip(kv, weights, strict=True)],
        index=df.index,
    )

    batch = serving["batch_size"].fillna(1)
    num = integers(df, err, required=ARCH_REQUIRED)
    models, arch = read_models(df, num, serving["input_len"], err)
    shape = {
        "heads": num["heads"],
        "kv_heads": num["kv_heads"].fillna(num["heads"]),
        "layers": num["layers"],
        "experts": num["num_experts"].fillna(0),
        "num_gpus": per_replica,
        "gbs": batch,
        "seq": serving["input_len"],
    }
    replica = {d.name: d.code(d.default) for d in layout.DIMENSIONS}
    replica |= {"tp": tp, "pp": pp, "mbs": batch, "sp": 0.0, "zero": 0.0}
    for name, rule, bad in layout.rules({**replica, **shape}):
        err.add(bad, f"{name}: {rule}")
    context = num["max_seq_len"]
    total = serving["input_len"] + serving["output_len"]
    total = total.where(np.isfinite(total))  # an infinite length is its cell's error already
    over = context.notna() & (total > context)
    err.add(
        over,
        "input_len: input_len + output_len = "
        + total.astype("Int64").astype(str)
        + " exceeds the model's context of "
        + context.astype("Int64").astype(str)
        + " tokens",
    )
    precision_for_gpu = weights.where(weights.isin(("fp8", "nvfp4")), "bf16")
    gpus = read_gpus(df, num, precision_for_gpu, err)
    flash = flag(df, "flash_attention", True, err).to_numpy()

    bad = err.bad
    deployments = pd.DataFrame(
        {
            "tp": tp,
            "pp": pp,
            "batch_size": batch,
            "input_len": serving["input_len"],
            "output_len": serving["output_len"],
            "replicas": replicas,
            **{ours: serving[col] for col, ours in ENGINE_INTS.items()},
            "kv_fraction": fraction.where(~bad_fraction),
        }
    )
    deployments["engine"] = engine_code(text_column(df, "framework"))
    # A row that leaves the running-batch limit or the token budget blank runs its engine's
    # defaults (spec/engines.py: TensorRT-LLM 2048 requests and 8192 tokens, ...).
    for code in deployments["engine"].unique():
        name = SERVING_ENGINES[int(code)]
        if name == "library":
            continue
        scheduler = engines.engine(name).scheduler
        mine = deployments["engine"] == code
        for col, fact in (
            ("max_seqs", scheduler.max_running_requests),
            ("max_tokens", scheduler.max_tokens_per_iteration),
        ):
            deployments.loc[mine, col] = deployments.loc[mine, col].fillna(float(str(fact.value)))
    for col, default in CONTINUOUS_DEFAULTS.items():
        deployments[col] = deployments[col].fillna(default)
    deployments = deployments.where(~pd.DataFrame({c: bad for c in deployments}), 1.0).fillna(1.0)
    deployments["precision"] = np.where(bad, "fp16", weights)
    deployments["kv_precision"] = np.where(bad, "fp16", kv)
    models = [PLACEHOLDER_MODEL if b else m for m, b in zip(models, bad, strict=True)]
    resolved = pd.DataFrame(
        {
            "tp": tp,
            "pp": pp,
            "replicas": replicas,
            "num_gpus": num_gpus,
            "precision": precision,
            "kv_precision": kv,
            "batching": batching,
            "mlp": arch["mlp"],
        },
        index=df.index,
    )
    return ServingRows(models, gpus, deployments, flash, err.msg, resolved)
