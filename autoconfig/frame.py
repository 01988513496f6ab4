"""Turns a table of runs (reference-CSV columns) into cost inputs plus a per-row error column.

Columns follow ../shared/reference/training_runs.csv: architecture columns stand in for the
model name, blanks and "unknown" get documented defaults, and a row that cannot be estimated
gets its reason in `error` while the other rows go on.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from autoconfig import catalog
from autoconfig.cost.inputs import MLP_CODES, RECOMPUTE_CODES, CostInputs, hardware_columns
from autoconfig.errors import UserError
from autoconfig.specs import ModelSpec

REQUIRED = ("layers", "hidden", "heads", "vocab", "seq_len", "gpu", "num_gpus", "tp", "pp", "gbs")
POSITIVE_INTS = (
    "layers",
    "hidden",
    "heads",
    "kv_heads",
    "ffn_hidden",
    "vocab",
    "seq_len",
    "num_gpus",
    "gpus_per_node",
    "tp",
    "pp",
    "vp",
    "cp",
    "ep",
    "dp",
    "mbs",
    "gbs",
    "head_dim",
    "moe_ffn_hidden",
    "max_seq_len",
)
NONNEG_INTS = ("num_experts", "topk", "shared_experts", "recompute_layers")
YES = {"y", "yes", "true", "1", "t"}
NO = {"n", "no", "false", "0", "f"}


def text_column(df: pd.DataFrame, col: str) -> pd.Series:
    """A column as stripped lower-case text ('' where missing or blank)."""
    if col not in df:
        return pd.Series([""] * len(df), index=df.index, dtype=object)
    return df[col].astype(object).where(df[col].notna(), "").astype(str).str.strip().str.lower()


def _flag(df: pd.DataFrame, col: str, default: pd.Series | bool) -> tuple[pd.Series, pd.Series]:
    """A y/n column as float (blank/unknown -> default) and the rows holding something else."""
    raw = text_column(df, col)
    value = pd.Series(
        np.broadcast_to(np.asarray(default, dtype=float), len(df)).copy(), index=df.index
    )
    value[raw.isin(YES)] = 1.0
    value[raw.isin(NO)] = 0.0
    bad = ~(raw.isin(YES) | raw.isin(NO) | raw.isin({"", "unknown", "nan"}))
    return value, bad


class _Errors:
    """Collects the first error message of each row."""

    def __init__(self, index: pd.Index) -> None:
        self.msg = pd.Series([""] * len(index), index=index, dtype=object)

    def add(self, mask: pd.Series | np.ndarray, message: str | pd.Series) -> None:
        mask = pd.Series(np.asarray(mask, dtype=bool), index=self.msg.index) & (self.msg == "")
        if isinstance(message, pd.Series):
            self.msg[mask] = message[mask]
        else:
            self.msg[mask] = message


ARCH_COLUMNS = (
    "layers",
    "hidden",
    "heads",
    "kv_heads",
    "head_dim",
    "ffn_hidden",
    "vocab",
    "tied_embeddings",
    "norm",
    "mlp",
    "position",
    "max_seq_len",
    "num_experts",
    "topk",
    "moe_ffn_hidden",
    "shared_experts",
)


def model_columns_for_frame(model: ModelSpec) -> dict[str, object]:
    """A catalog model as reference-CSV architecture columns."""
    return {
        "model": model.name,
        "layers": model.layers,
        "hidden": model.hidden,
        "heads": model.heads,
        "kv_heads": model.kv,
        "head_dim": model.dhead,
        "ffn_hidden": model.ffn,
        "vocab": model.vocab,
        "tied_embeddings": "y" if model.tied_embeddings else "n",
        "norm": model.norm,
        "mlp": model.mlp,
        "position": model.position,
        "dropout": "y" if model.dropout else "n",
        "max_seq_len": model.max_seq_len or model.seq_len,
        "num_experts": model.num_experts,
        "topk": model.topk,
        "moe_ffn_hidden": model.expert_ffn,
        "shared_experts": model.shared_experts,
    }


def _fill_from_catalog(df: pd.DataFrame) -> pd.DataFrame:
    """Blank architecture cells of rows whose `model` names a catalog model take its values."""
    if "model" not in df:
        return df
    by_name = {name.lower(): spec for name, spec in catalog.models().items()}
    names = text_column(df, "model")
    matched = names[names.isin(by_name)]
    if matched.empty:
        return df
    df = df.copy()
    for name in matched.unique():
        rows = names == name
        known = model_columns_for_frame(by_name[name])
        for col in ARCH_COLUMNS:
            if col not in df:
                df[col] = ""
            blank = rows & text_column(df, col).isin({"", "nan", "unknown"})
            df[col] = df[col].astype(object)
            df.loc[blank, col] = known[col]
    return df


def prepare(df: pd.DataFrame) -> tuple[CostInputs, pd.Series, pd.DataFrame]:
    """Cost inputs for every row, the error of each row ('' when fine), and the resolved
    layout columns (dp, sp, zero, recompute, ... after defaults) for display."""
    df = _fill_from_catalog(df)
    err = _Errors(df.index)
    num: dict[str, pd.Series] = {}
    for col in (*POSITIVE_INTS, *NONNEG_INTS):
        raw = df[col] if col in df else pd.Series([np.nan] * len(df), index=df.index)
        text = raw.astype(object).where(raw.notna(), "").astype(str).str.strip()
        blank = text.isin({"", "unknown", "nan", "None"})
        value = pd.to_numeric(text.where(~blank, None), errors="coerce")
        if col in REQUIRED:
            err.add(blank, f"{col}: required, must be a positive integer")
        not_int = ~blank & (value.isna() | (value != np.round(value)))
        err.add(
            not_int,
            f"{col}: must be an integer" + pd.Series(" (got '", index=df.index) + text + "')",
        )
        low = 0 if col in NONNEG_INTS else 1
        err.add(
            ~blank & (value < low),
            f"{col}: must be >= {low}" + pd.Series(" (got ", index=df.index) + text + ")",
        )
        num[col] = value.where(~blank)
    for col in REQUIRED:
        if col not in df:
            raise UserError(f"runs: missing required column '{col}'")

    hidden, heads = num["hidden"], num["heads"]
    kv = num["kv_heads"].fillna(heads)
    head_dim = num["head_dim"].fillna(hidden / heads)
    ffn = num["ffn_hidden"]
    experts = num["num_experts"].fillna(0)

    # Architecture defaults: a blank MLP is SwiGLU when the shape says so (GQA, or an FFN
    # ratio other than GPT's 4), else GELU; a blank norm follows the MLP family.
    mlp = text_column(df, "mlp").replace({"squared-relu": "squared_relu", "relu2": "squared_relu"})
    llama_shape = (kv < heads) | (ffn.notna() & (ffn != 4 * hidden))
    mlp = mlp.where(mlp != "", np.where(llama_shape, "swiglu", "gelu"))
    err.add(~mlp.isin(MLP_CODES), "mlp: must be gelu, swiglu or squared_relu")
    norm = text_column(df, "norm")
    norm = norm.where(norm != "", np.where(mlp == "swiglu", "rmsnorm", "layernorm"))
    err.add(~norm.isin({"layernorm", "rmsnorm"}), "norm: must be layernorm or rmsnorm")
    position = text_column(df, "position")
    position = position.where(position != "", np.where(mlp == "swiglu", "rope", "learned"))
    tied, bad = _flag(df, "tied_embeddings", mlp != "swiglu")
    err.add(bad, "tied_embeddings: must be y or n")
    dropout, bad = _flag(df, "dropout", False)
    err.add(bad, "dropout: must be y or n")
    flash, bad = _flag(df, "flash_attention", True)
    err.add(bad, "flash_attention: must be y or n")
    overlap, bad = _flag(df, "overlap_grad_reduce", True)
    err.add(bad, "overlap_grad_reduce: must be y or n")
    gathered, bad = _flag(df, "sp_saves_gathered", False)
    err.add(bad, "sp_saves_gathered: must be y or n")

    tp, pp, cp = num["tp"], num["pp"], num["cp"].fillna(1)
    vp, ep, mbs = num["vp"].fillna(1), num["ep"].fillna(1), num["mbs"].fillna(1)
    num_gpus = num["num_gpus"]
    dp = num["dp"].fillna(num_gpus / (tp * pp * cp))
    sp, bad = _flag(df, "sp", tp > 1)
    err.add(bad, "sp: must be y, n or unknown")
    err.add((sp > 0) & (tp == 1), "sp: sequence parallel needs tp > 1")

    zero_raw = text_column(df, "zero")
    zero = pd.to_numeric(zero_raw.where(~zero_raw.isin({"", "unknown"}), "1"), errors="coerce")
    err.add(zero.isna() | ~zero.isin([0, 1, 2, 3]), "zero: must be 0, 1, 2 or 3")
    recompute = text_column(df, "recompute").replace({"": "none", "unknown": "none"})
    err.add(~recompute.isin(RECOMPUTE_CODES), "recompute: must be none, selective, full or op")
    precision = text_column(df, "precision").replace({"": "bf16"})
    err.add(~precision.isin({"bf16", "fp16", "fp8"}), "precision: must be bf16, fp16 or fp8")

    # Layout rules: the run must be a real, complete layout.
    err.add(heads % tp != 0, "tp: must divide heads")
    err.add(
        num_gpus != tp * pp * cp * dp,
        "num_gpus: must equal tp*pp*cp*dp"
        + pd.Series(" (tp*pp*cp*dp = ", index=df.index)
        + (tp * pp * cp * dp).astype(str)
        + ")",
    )
    err.add(dp != np.round(dp), "dp: num_gpus is not divisible by tp*pp*cp")
    err.add((kv % tp != 0) & (tp % kv != 0), "tp: must divide kv_heads (or be a multiple)")
    err.add(((hidden % heads) != 0) & num["head_dim"].isna(), "heads: must divide hidden")
    err.add(num["gbs"] % (dp * mbs) != 0, "gbs: must be divisible by dp*mbs")
    err.add(pp > num["layers"], "pp: cannot exceed layers")
    err.add((vp > 1) & (pp == 1), "vp: virtual stages need pp > 1")
    err.add(num["seq_len"] % cp != 0, "cp: must divide seq_len")
    err.add((experts > 0) & (experts % ep != 0), "ep: must divide num_experts")
    err.add((ep > 1) & ((dp * cp) % ep != 0), "ep: must divide dp*cp")
    err.add((ep > 1) & (experts == 0), "ep: expert parallelism needs an MoE model")
    topk = num["topk"].fillna(0)
    err.add((experts > 0) & ((topk < 1) | (topk > experts)), "topk: must be in 1..num_experts")

    # Hardware columns, looked up once per distinct GPU name.
    gpu_names = text_column(df, "gpu")
    hw: dict[str, np.ndarray] = {}
    for name in gpu_names.unique():
        rows = (gpu_names == name).to_numpy()
        try:  # a catalog name, or a profile file's path (autoconfig calibrate's output)
            gpu = catalog.get_gpu(str(df.loc[rows, "gpu"].iloc[0]))
        except UserError as exc:
            err.add(rows, str(exc))
            continue
        for prec in precision[rows].unique():
            sel = rows & (precision == prec).to_numpy()
            if prec == "fp8" and "fp8" not in gpu.peak_tflops:
                err.add(sel, f"precision: {name} has no fp8 tensor cores")
            gpn = num["gpus_per_node"][sel]
            for node in gpn.fillna(gpu.cluster.gpus_per_node).unique():
                rows_node = (
                    sel
                    & (num["gpus_per_node"].fillna(gpu.cluster.gpus_per_node) == node).to_numpy()
                )
                cols = hardware_columns(
                    gpu,
                    catalog.cluster_for(gpu, int(node)),
                    prec if prec in gpu.peak_tflops else "bf16",
                )
                for key, value in cols.items():
                    hw.setdefault(key, np.full(len(df), np.nan))[rows_node] = value

    per_stage = np.ceil(num["layers"] / (pp * vp)) * vp
    rl = num["recompute_layers"].fillna(per_stage)
    err.add(
        (recompute != "full") & num["recompute_layers"].notna() & (num["recompute_layers"] > 0),
        "recompute_layers: only meaningful with recompute full",
    )

    bad = err.msg != ""

    # Rows in error still flow through the vectorized model with harmless stand-in values;
    # their predictions are blanked afterwards.
    def col(series: pd.Series | np.ndarray, fill: float = 1.0) -> np.ndarray:
        arr = np.asarray(series, dtype=float).copy()
        arr[bad.to_numpy() | ~np.isfinite(arr)] = fill
        return arr

    if not hw:  # every GPU unknown: NaN columns of the right names
        any_gpu = next(iter(catalog.gpus().values()))
        hw = {
            k: np.full(len(df), np.nan) for k in hardware_columns(any_gpu, any_gpu.cluster, "bf16")
        }
    inputs = CostInputs.from_columns(
        {
            "layers": col(num["layers"]),
            "hidden": col(hidden, 64),
            "heads": col(heads),
            "kv_heads": col(kv),
            "head_dim": col(head_dim, 64),
            "ffn": col(ffn.fillna(4 * hidden), 256),
            "vocab": col(num["vocab"], 256),
            "tied": col(tied, 0),
            "layernorm": col(norm == "layernorm", 0),
            "mlp_kind": col(mlp.map(MLP_CODES), 0),
            "learned_pos": col(position == "learned", 0),
            "max_seq": col(num["max_seq_len"].fillna(num["seq_len"])),
            "dropout": col(dropout, 0),
            "experts": col(experts, 0),
            "topk": col(topk, 0),
            "expert_ffn": col(num["moe_ffn_hidden"].fillna(ffn.fillna(4 * hidden)), 256),
            "shared_experts": col(num["shared_experts"].fillna(0), 0),
            **{k: col(v) for k, v in hw.items()},
            "dp": col(dp),
            "tp": col(tp),
            "pp": col(pp),
            "vp": col(vp),
            "cp": col(cp),
            "ep": col(ep),
            "sp": col(sp, 0),
            "mbs": col(mbs),
            "gbs": col(num["gbs"]),
            "seq": col(num["seq_len"], 128),
            "recompute": col(recompute.map(RECOMPUTE_CODES), 0),
            "recompute_layers": col(rl, 0),
            "zero": col(zero, 0),
            "fp8": col(precision == "fp8", 0),
            "flash": col(flash, 1),
            "overlap_grad_reduce": col(overlap, 1),
            "sp_saves_gathered": col(gathered, 0),
        }
    )
    resolved = pd.DataFrame(
        {
            "dp": dp,
            "tp": tp,
            "pp": pp,
            "vp": vp,
            "cp": cp,
            "ep": ep,
            "sp": sp.astype(bool),
            "mbs": mbs,
            "zero": zero,
            "recompute": recompute,
            "precision": precision,
            "flash_attention": flash.astype(bool),
            "mlp": mlp,
            "norm": norm,
        },
        index=df.index,
    )
    return inputs, err.msg, resolved


def model_from_row(row: pd.Series) -> ModelSpec:
    """A ModelSpec from one row's architecture columns (with prepare()'s defaults)."""
    frame = _fill_from_catalog(row.to_frame().T.reset_index(drop=True))
    x, errors, resolved = prepare(frame)
    if errors.iloc[0] and not errors.iloc[0].startswith(("num_gpus", "gbs", "dp", "tp", "pp")):
        raise UserError(errors.iloc[0])
    g = lambda name: float(np.asarray(getattr(x, name)).ravel()[0])  # noqa: E731
    experts = int(g("experts"))
    return ModelSpec(
        name=str(frame.at[0, "model"]) if "model" in frame else "row",
        layers=int(g("layers")),
        hidden=int(g("hidden")),
        heads=int(g("heads")),
        kv_heads=int(g("kv_heads")),
        head_dim=int(g("head_dim")),
        ffn_hidden=int(g("ffn")),
        vocab=int(g("vocab")),
        seq_len=int(g("seq")),
        max_seq_len=int(max(g("max_seq"), g("seq"))),
        tied_embeddings=bool(g("tied")),
        norm=resolved.at[0, "norm"],
        mlp=resolved.at[0, "mlp"],
        position="learned" if g("learned_pos") else "rope",
        dropout=bool(g("dropout")),
        num_experts=experts,
        topk=int(g("topk")) if experts else 0,
        moe_ffn_hidden=int(g("expert_ffn")) if experts else None,
    )


def with_predictions(rows: pd.DataFrame, preds: dict, errors: pd.Series) -> pd.DataFrame:
    """The input columns, then the prediction columns (blank on rows with an error), then
    `error`. A prediction column of the input's name replaces it."""
    preds = pd.DataFrame(preds, index=rows.index)
    preds["pred_fits"] = preds["pred_fits"].astype(object)
    preds.loc[errors != "", :] = np.nan
    extra = [c for c in preds.columns if c in rows.columns]
    out = pd.concat([rows.drop(columns=extra), preds], axis=1)
    out["error"] = errors
    return out
