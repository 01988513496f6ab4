"""Turns a table of serving points (inference_runs.csv columns) into serving cost inputs plus a
per-row error column.

Architecture columns are read exactly as for training runs (frame.prepare, catalog names fill
blanks); the serving columns are batch_size, input_len, output_len, tp, pp, num_gpus (GPUs of
the whole deployment; replicas = num_gpus / (tp*pp), or a `replicas` column), precision
(fp16, bf16, fp8, int8 weights; fp32 for CPU trials) and an optional kv_precision (fp16,
bf16, fp8, int8, fp32; auto = the weights' 16-bit type).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from autoconfig import catalog
from autoconfig.cost.inference import ServeInputs, constant_columns, inference_constants
from autoconfig.errors import UserError
from autoconfig.frame import prepare, text_column

REQUIRED = ("batch_size", "input_len", "output_len", "tp", "pp", "gpu")
# fp32 is what the bundled model runs on CPU.
WEIGHT_PRECISIONS = {"fp16": 2.0, "bf16": 2.0, "fp8": 1.0, "int8": 1.0, "fp32": 4.0}
KV_PRECISIONS = {"fp16": 2.0, "bf16": 2.0, "fp8": 1.0, "int8": 1.0, "fp32": 4.0}
# Columns of the training cost model that mean something else (or nothing) for serving.
TRAINING_ONLY = ("seq_len", "gbs", "mbs", "dp", "cp", "vp", "ep", "sp", "zero", "recompute")


def _ints(df: pd.DataFrame, col: str) -> tuple[pd.Series, pd.Series]:
    """(value, blank) of an integer column."""
    raw = df[col] if col in df else pd.Series([np.nan] * len(df), index=df.index)
    text = raw.astype(object).where(raw.notna(), "").astype(str).str.strip()
    blank = text.isin({"", "nan", "None", "unknown"})
    return pd.to_numeric(text.where(~blank, None), errors="coerce"), blank


def prepare_serving(df: pd.DataFrame) -> tuple[ServeInputs, pd.Series, pd.DataFrame]:
    """Serving inputs for every row, each row's error ('' when fine), and resolved columns."""
    for col in REQUIRED:
        if col not in df:
            raise UserError(f"runs: missing required column '{col}'")
    df = df.reset_index(drop=True)
    errors = pd.Series([""] * len(df), index=df.index, dtype=object)

    def add(mask: pd.Series | np.ndarray, message: str) -> None:
        mask = pd.Series(np.asarray(mask, dtype=bool), index=df.index) & (errors == "")
        errors[mask] = message

    values: dict[str, pd.Series] = {}
    for col in ("batch_size", "input_len", "output_len", "tp", "pp", "num_gpus", "replicas"):
        value, blank = _ints(df, col)
        if col in ("batch_size", "input_len", "output_len", "tp", "pp"):
            add(blank, f"{col}: required, must be a positive integer")
        add(~blank & (value.isna() | (value != np.round(value))), f"{col}: must be an integer")
        add(~blank & (value < 1), f"{col}: must be a positive integer")
        values[col] = value
    tp, pp = values["tp"].fillna(1), values["pp"].fillna(1)
    per_replica = tp * pp
    num_gpus = values["num_gpus"].fillna(values["replicas"].fillna(1) * per_replica)
    replicas = values["replicas"].fillna(num_gpus / per_replica)
    add(
        replicas * per_replica != num_gpus,
        "num_gpus: must be a multiple of tp*pp (replicas = num_gpus / (tp*pp))",
    )
    precision = text_column(df, "precision").replace({"": "fp16"})
    add(~precision.isin(WEIGHT_PRECISIONS), "precision: must be fp16, bf16, fp8, int8 or fp32")
    kv_precision = text_column(df, "kv_precision").replace({"": "auto"})
    kv_precision = kv_precision.where(
        kv_precision != "auto",
        precision.where(precision.isin({"fp16", "bf16", "fp32"}), "fp16"),
    )
    add(~kv_precision.isin(KV_PRECISIONS), "kv_precision: must be fp16, bf16, fp8, int8 or fp32")

    # The layout as the training cost model's columns: one replica, no data parallelism, the
    # input length as the sequence, the batch as one micro-batch.
    train = df.drop(columns=[c for c in TRAINING_ONLY if c in df]).copy()
    train["seq_len"] = df["input_len"]
    train["gbs"] = df["batch_size"]
    train["mbs"] = df["batch_size"]
    train["dp"] = 1
    train["num_gpus"] = per_replica.where(per_replica.notna(), 1).astype("Int64").astype(str)
    train["sp"] = "n"
    train["zero"] = "0"
    train["precision"] = np.where(precision == "fp8", "fp8", "fp16")
    x, train_errors, resolved = prepare(train)
    train_errors = train_errors.str.replace(r"^seq_len:", "input_len:", regex=True)
    train_errors = train_errors.str.replace(r"^(gbs|mbs):", "batch_size:", regex=True)
    errors = errors.where(errors != "", train_errors)

    # Context limit, where the row (or its catalog model) states one.
    limit, _ = _ints(df.assign(**_catalog_limits(df)), "max_seq_len")
    total = values["input_len"] + values["output_len"]
    for i in df.index[(errors == "") & limit.notna() & (total > limit)]:
        errors[i] = (
            f"input_len: input_len + output_len = {int(total[i])} exceeds the model's "
            f"context of {int(limit[i])} tokens"
        )

    consts = _constants(df, errors)
    bad = (errors != "").to_numpy()

    def col(series: pd.Series | np.ndarray, fill: float = 1.0) -> np.ndarray:
        arr = np.asarray(series, dtype=float).copy()
        arr[bad | ~np.isfinite(arr)] = fill
        return arr

    s = ServeInputs(
        x=x,
        batch=col(values["batch_size"]),
        input_len=col(values["input_len"]),
        output_len=col(values["output_len"]),
        weight_bytes=col(precision.map(WEIGHT_PRECISIONS), 2.0),
        kv_bytes=col(kv_precision.map(KV_PRECISIONS), 2.0),
        replicas=col(replicas),
        **{k: col(v) for k, v in consts.items()},
    )
    resolved = pd.DataFrame(
        {
            "tp": tp,
            "pp": pp,
            "replicas": replicas,
            "num_gpus": num_gpus,
            "precision": precision,
            "kv_precision": kv_precision,
            "mlp": resolved["mlp"],
        },
        index=df.index,
    )
    return s, errors, resolved


def _catalog_limits(df: pd.DataFrame) -> dict[str, pd.Series]:
    """max_seq_len per row: the row's own, else its catalog model's context, else blank."""
    own, blank = _ints(df, "max_seq_len")
    if "model" not in df:
        return {"max_seq_len": own}
    by_name = {name.lower(): spec for name, spec in catalog.models().items()}
    names = text_column(df, "model")
    known = names.map(
        lambda n: (by_name[n].max_seq_len or by_name[n].seq_len) if n in by_name else None
    )
    return {"max_seq_len": own.where(~blank, pd.to_numeric(known, errors="coerce"))}


def _constants(df: pd.DataFrame, errors: pd.Series) -> dict[str, np.ndarray]:
    """The serving efficiency constants of each row's GPU."""
    names = text_column(df, "gpu")
    out: dict[str, np.ndarray] = {}
    for name in names.unique():
        rows = (names == name).to_numpy()
        try:
            gpu = catalog.get_gpu(str(df.loc[rows, "gpu"].iloc[0]))
        except UserError:
            continue  # prepare() already reported it
        consts, _ = inference_constants(gpu)
        for key, value in constant_columns(consts).items():
            out.setdefault(key, np.full(len(df), np.nan))[rows] = value
    if not out:
        names_ = ("eff_memory", "eff_gemm", "kernel_s", "ar_base_s", "ar_step_s")
        out = {k: np.full(len(df), np.nan) for k in names_}
    return out
