"""Compares serving predictions with the published inference measurements (shared by the
validation and fit scripts).

Facts about the published runs that the CSV has no column for are applied here once, as input
columns: FasterTransformer (2021-2022) and Megatron-LM's text-generation server computed the
context phase with unfused softmax attention (FasterTransformer docs/gpt_guide.md; flash
attention post-dates both measurements).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from autoconfig.calibrate.validation import (
    error_stats,
    in_fit_set,
    read_reference,
    require_reference_dir,
)
from autoconfig.serve.predict import predict_frame
from autoconfig.spec.catalog import get_gpu

SOURCE_FACTS = {
    "fastertransformer": {"flash_attention": "n"},
    "megatron-lm": {"flash_attention": "n"},
    # TensorRT-LLM's perf-overview runs NVIDIA's ModelOpt FP8 / NVFP4 checkpoints, which
    # quantise the K/V cache to fp8 (their hf_quant_config: kv_cache_quant_algo FP8); the
    # runtime keeps 0.95 of the free memory for K/V (the table's notes) in blocks of 32 tokens
    # (KvCacheConfig tokens_per_block), and its defaults cap the batch at max_batch_size 2048
    # and max_num_tokens 8192 per iteration (TensorRT-LLM LlmArgs).
    "tensorrt-llm": {
        "kv_precision": "fp8",
        "kv_cache_fraction": "0.95",
        "kv_block_tokens": "32",
        "max_num_seqs": "2048",
        "max_num_batched_tokens": "8192",
    },
}
# The model describes a serving engine with fused kernels; the calibration fits only rows of
# one (Megatron-LM's reference server is reported, not fitted).
FIT_FRAMEWORKS = ("fastertransformer", "tensorrt-llm")


def load_inference_runs(path: Path | None = None) -> pd.DataFrame:
    runs = read_reference(
        path or require_reference_dir() / "inference_runs.csv", SOURCE_FACTS, "framework"
    )
    runs["fit_set"] = runs["run_id"].map(in_fit_set) & runs["framework"].isin(FIT_FRAMEWORKS)
    return runs


def predictions(runs: pd.DataFrame) -> pd.DataFrame:
    out = predict_frame(runs)
    for metric in ("latency_ms", "ttft_ms", "tpot_ms", "output_tokens_per_s_per_gpu"):
        measured = pd.to_numeric(out[f"measured_{metric}"], errors="coerce")
        if metric == "output_tokens_per_s_per_gpu":
            # Derived where only the batch latency was published: batch*output/latency/GPUs.
            num = lambda c: pd.to_numeric(out[c], errors="coerce")  # noqa: E731
            derived = (
                num("batch_size")
                * num("output_len")
                / (num("measured_latency_ms") / 1e3)
                / (num("tp") * num("pp"))
            )
            measured = measured.fillna(derived)
        out[f"meas_{metric}"] = measured
        out[f"ape_{metric}"] = (out[f"pred_{metric}"].astype(float) / measured - 1).abs()
    return out


def accuracy_table(out: pd.DataFrame) -> pd.DataFrame:
    """Static batches: latency and throughput errors per (source model, framework), held-out
    rows, and all."""
    ok = out[(out["error"] == "") & (out["batching"] != "inflight")]
    groups = [(f"{m} / {f}", g) for (m, f), g in ok.groupby(["model", "framework"], sort=True)]
    groups += [
        ("held-out (not fitted)", ok[~ok["fit_set"]]),
        ("fitted third", ok[ok["fit_set"]]),
        ("ALL", ok),
    ]
    rows = []
    for name, g in groups:
        lat = error_stats(g["ape_latency_ms"])
        thr = error_stats(g["ape_output_tokens_per_s_per_gpu"])
        rows.append(
            {
                "group": name,
                "rows": lat["rows"],
                "latency median APE %": lat["median_ape_%"],
                "latency within ±20% %": lat["within_20%"],
                "latency MAPE %": lat["mape_%"],
                "throughput median APE %": thr["median_ape_%"],
                "throughput within ±20% %": thr["within_20%"],
            }
        )
    return pd.DataFrame(rows)


def inflight_table(out: pd.DataFrame) -> pd.DataFrame:
    """Continuous (in-flight) batching at max load: output tokens/s per GPU errors per GPU,
    per model, held-out rows apart, and all."""
    ok = out[(out["error"] == "") & (out["batching"] == "inflight")]
    groups = [(f"{g} / {p}", rows) for (g, p), rows in ok.groupby(["gpu", "precision"])]
    groups += [(f"{m}", rows) for m, rows in ok.groupby("model")]
    groups += [(f"tp{t} pp{p}", rows) for (t, p), rows in ok.groupby(["tp", "pp"])]
    groups += [
        ("held-out (not fitted)", ok[~ok["fit_set"]]),
        ("fitted third", ok[ok["fit_set"]]),
        ("ALL", ok),
    ]
    table = []
    for name, g in groups:
        thr = error_stats(g["ape_output_tokens_per_s_per_gpu"])
        bias = (
            g["pred_output_tokens_per_s_per_gpu"].astype(float)
            / g["meas_output_tokens_per_s_per_gpu"]
        ).median()
        table.append(
            {
                "group": name,
                "rows": thr["rows"],
                "median APE %": thr["median_ape_%"],
                "within ±20% %": thr["within_20%"],
                "MAPE %": thr["mape_%"],
                "median predicted/measured": bias,
            }
        )
    return pd.DataFrame(table)


def phase_table(out: pd.DataFrame) -> pd.DataFrame:
    """TTFT and TPOT where they were published."""
    ok = out[(out["error"] == "") & out["meas_ttft_ms"].notna() & (out["batching"] != "inflight")]
    cols = ["model", "tp", "batch_size", "input_len", "output_len", "meas_ttft_ms"]
    cols += ["pred_ttft_ms", "meas_tpot_ms", "pred_tpot_ms"]
    return ok[cols].reset_index(drop=True)


def _left_out(
    runs: pd.DataFrame,
    mine: pd.Series,
    others: pd.Series,
    names: tuple[str, ...],
    measured: pd.Series,
) -> tuple[np.ndarray, dict[str, float]]:
    """The APE (%) of the `mine` rows predicted with `names` refitted on the `others` rows
    alone (the rest of each row's constants its profile's), and the refitted values."""
    from autoconfig.calibrate.serving_fit import fit, predict

    constants, _ = fit(runs[others].reset_index(drop=True), {}, names)
    shared = {n: constants[n] for n in names}
    predicted = predict(runs[mine].reset_index(drop=True), shared)
    return np.abs(predicted / measured[mine].to_numpy() - 1.0) * 100, shared


def left_out_by_family(runs: pd.DataFrame, out: pd.DataFrame) -> pd.DataFrame:
    """TensorRT-LLM's in-flight rows of each GPU family (chip) predicted by the constants that
    stay fitted (serving_fit.MEASURED_CONTINUOUS: memory share, host work per iteration and per
    sequence), refitted on the other families' fit rows alone, one set for them all; beside,
    the shipped per-chip fit on the same rows (`out`, from predictions)."""
    from autoconfig.calibrate.serving_fit import MEASURED_CONTINUOUS

    inflight = (runs["batching"] == "inflight") & (runs["framework"] == "tensorrt-llm")
    chip = runs["gpu"].map(lambda g: get_gpu(g).chip)
    measured = pd.to_numeric(runs["measured_output_tokens_per_s_per_gpu"], errors="coerce")
    table = []
    for family in sorted(chip[inflight].unique()):
        mine = inflight & (chip == family)
        others = inflight & (chip != family) & runs["fit_set"]
        ape, shared = _left_out(runs, mine, others, MEASURED_CONTINUOUS, measured)
        shipped = out.loc[mine, "ape_output_tokens_per_s_per_gpu"].astype(float) * 100
        table.append(
            {
                "family": family,
                "gpus": ", ".join(sorted(runs.loc[mine, "gpu"].unique())),
                "rows": int(mine.sum()),
                "fit_rows_from_others": int(others.sum()),
                "left_out_median_ape_%": float(np.median(ape)),
                "left_out_within_20_%": float(np.mean(ape <= 20) * 100),
                "shipped_fit_median_ape_%": float(shipped.median()),
                **{f"refit_{n}": round(v, 4) for n, v in shared.items()},
            }
        )
    return pd.DataFrame(table)


def static_left_out_by_model(runs: pd.DataFrame, out: pd.DataFrame) -> pd.DataFrame:
    """FasterTransformer's static-batch rows of each model predicted by the constants that stay
    fitted for static batches (serving_fit.MEASURED_STATIC: memory share, work per step),
    refitted on the other models' fit rows alone; beside, the shipped fit on the same rows.
    End-to-end latency, median APE."""
    from autoconfig.calibrate.serving_fit import MEASURED_STATIC

    static = (runs["batching"] != "inflight") & (runs["framework"] == "fastertransformer")
    measured = pd.to_numeric(runs["measured_latency_ms"], errors="coerce")
    table = []
    for model in sorted(runs.loc[static, "model"].unique()):
        mine = static & (runs["model"] == model) & measured.notna()
        others = static & (runs["model"] != model) & runs["fit_set"]
        if not mine.any() or not others.any():
            continue
        ape, shared = _left_out(runs, mine, others, MEASURED_STATIC, measured)
        shipped = out.loc[mine, "ape_latency_ms"].astype(float) * 100
        table.append(
            {
                "model": model,
                "rows": int(mine.sum()),
                "fit_rows_from_others": int(others.sum()),
                "left_out_median_ape_%": float(np.median(ape)),
                "shipped_fit_median_ape_%": float(shipped.median()),
                **{f"refit_{n}": round(v, 4) for n, v in shared.items()},
            }
        )
    return pd.DataFrame(table)
