"""The Python API: estimate one configuration or a table of runs, returning DataFrames."""

from __future__ import annotations

import numpy as np
import pandas as pd

from autoconfig import catalog
from autoconfig.cost import PREDICTION_COLUMNS, evaluate
from autoconfig.errors import UserError
from autoconfig.frame import prepare
from autoconfig.specs import ModelSpec


def estimate_frame(runs: pd.DataFrame) -> pd.DataFrame:
    """Predictions for every row of `runs` (reference-CSV columns).

    Returns the input columns followed by the pred_* columns, the memory and time breakdowns,
    and `error` ('' for rows that were estimated; the reason otherwise, with blank predictions).
    """
    return _estimate(runs)[0]


def _estimate(runs: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    if runs.empty:
        empty = runs.assign(**{c: pd.Series(dtype=float) for c in PREDICTION_COLUMNS}, error="")
        return empty, pd.DataFrame()
    runs = runs.reset_index(drop=True)
    inputs, errors, resolved = prepare(runs)
    with np.errstate(all="ignore"):
        preds = pd.DataFrame(evaluate(inputs), index=runs.index)
    bad = errors != ""
    preds["pred_fits"] = preds["pred_fits"].astype(object)
    preds.loc[bad, :] = np.nan
    extra = [c for c in preds.columns if c in runs.columns]
    out = pd.concat([runs.drop(columns=extra), preds], axis=1)
    out["error"] = errors
    return out, resolved


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


def estimate(
    model: str | ModelSpec,
    gpu: str,
    num_gpus: int,
    *,
    tp: int = 1,
    pp: int = 1,
    vp: int = 1,
    cp: int = 1,
    ep: int = 1,
    dp: int | None = None,
    sp: bool | None = None,
    mbs: int = 1,
    gbs: int | None = None,
    seq_len: int | None = None,
    recompute: str = "none",
    recompute_layers: int | None = None,
    zero: int = 1,
    precision: str = "bf16",
    flash_attention: bool = True,
    gpus_per_node: int | None = None,
) -> pd.DataFrame:
    """One configuration's predictions and breakdown as a one-row DataFrame.

    Raises UserError with a one-line reason when the configuration is invalid.
    """
    spec = catalog.get_model(model) if isinstance(model, str) else model
    catalog.get_gpu(gpu)  # unknown names fail here with the closest names
    if num_gpus < 1:
        raise UserError(f"gpus: must be a positive integer (got {num_gpus})")
    dp = dp if dp is not None else num_gpus // max(tp * pp * cp, 1)
    row = {
        **model_columns_for_frame(spec),
        "seq_len": seq_len or spec.seq_len,
        "gpu": gpu,
        "num_gpus": num_gpus,
        "gpus_per_node": gpus_per_node,
        "tp": tp,
        "pp": pp,
        "vp": vp,
        "cp": cp,
        "ep": ep,
        "dp": dp,
        "sp": "unknown" if sp is None else ("y" if sp else "n"),
        "mbs": mbs,
        "gbs": gbs if gbs is not None else dp * mbs,
        "recompute": recompute,
        "recompute_layers": recompute_layers,
        "zero": zero,
        "precision": precision,
        "flash_attention": "y" if flash_attention else "n",
    }
    out, resolved = _estimate(pd.DataFrame([row]))
    if out.at[0, "error"]:
        raise UserError(out.at[0, "error"])
    # Show what was actually estimated (defaults resolved), not the placeholders.
    for col in ("dp", "sp", "zero", "recompute", "precision", "flash_attention"):
        out[col] = resolved[col].to_numpy()
    out["mbs"] = resolved["mbs"].to_numpy()
    return out
