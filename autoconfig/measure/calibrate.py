"""`autoconfig calibrate RUN`: refit the GPU profile's efficiency constants to what a measured
search measured, print the model's error before and after, and write the profile (recording
what it was fitted on) for later searches' --profile."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import optuna
import pandas as pd
import yaml
from rich.console import Console
from rich.table import Table

from autoconfig import catalog
from autoconfig.cost.evaluate import evaluate
from autoconfig.errors import UserError
from autoconfig.fit import fit_time, with_params
from autoconfig.frame import prepare
from autoconfig.measure.study import STUDY_NAME, exists, open_storage, storage_url
from autoconfig.specs import GPUSpec
from autoconfig.trainer.config import TrainConfig, load_config

# What a handful of trials on one machine can pin down; the inter-node constants need trials
# that cross nodes and join the fit only then.
LOCAL_PARAMS = (
    "gemm",
    "attention",
    "kernel_us",
    "intra_node_bus",
    "intra_node_latency_us",
    "step_overhead_ms",
)
NETWORK_PARAMS = ("inter_node_bus", "inter_node_latency_us")
# Wider than the published-run fit's ranges: CPU ranks over gloo are far slower than GPUs.
BOUNDS = {
    "kernel_us": (0.0, 5000.0),
    "intra_node_latency_us": (0.0, 20000.0),
    "inter_node_latency_us": (0.0, 20000.0),
    "step_overhead_ms": (0.0, 20000.0),
    "gemm": (0.01, 1.0),
    "attention": (0.01, 1.0),
}


def measured_runs(run: Path, storage: str | None = None) -> pd.DataFrame:
    """One row per successful trial, in the columns of training_runs.csv."""
    url = storage_url(run, storage)
    if storage is None and not (run / "study.db").exists():
        raise UserError(f"run: no measured search in '{run}' (no study.db)")
    store = open_storage(url)
    if not exists(store):
        raise UserError(f"run: no measured search in '{url}'")
    study = optuna.load_study(study_name=STUDY_NAME, storage=store)
    rows = [
        run_row(load_config(Path(t.user_attrs["run_dir"]) / "config.json"), t.value, t.number)
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    ]
    if not rows:
        raise UserError(f"run: '{run}' has no successful trial to calibrate on")
    return pd.DataFrame(rows)


def run_row(cfg: TrainConfig, measured: float | None, number: int) -> dict[str, object]:
    """A trial as a row of training_runs.csv's columns."""
    spec = cfg.trained_spec()
    return {
        "run_id": f"trial-{number}",
        "model": spec.name,
        "layers": spec.layers,
        "hidden": spec.hidden,
        "heads": spec.heads,
        "kv_heads": spec.kv_heads,
        "ffn_hidden": spec.ffn_hidden,
        "vocab": spec.vocab,
        "tied_embeddings": "y" if spec.tied_embeddings else "n",
        "norm": spec.norm,
        "mlp": spec.mlp,
        "position": spec.position,
        "seq_len": cfg.seq(spec),
        "gpu": cfg.gpu or "h100-sxm-80gb",
        "num_gpus": cfg.world,
        "tp": cfg.tp,
        "pp": cfg.pp,
        "vp": cfg.vp,
        "cp": cfg.cp,
        "ep": cfg.ep,
        "dp": cfg.resolved_dp,
        "sp": "y" if cfg.sp else "n",
        "zero": cfg.zero,
        "recompute": cfg.recompute,
        "recompute_layers": cfg.recompute_layers if cfg.recompute == "full" else None,
        "mbs": cfg.mbs,
        "gbs": cfg.global_batch,
        "precision": "bf16",
        "sp_saves_gathered": "y",  # the bundled trainer's DTensor SP
        "measured_tokens_per_s_per_gpu": measured,
        "status": "ok",
    }


def fit(runs: pd.DataFrame, base: GPUSpec) -> tuple[dict[str, float], np.ndarray, np.ndarray]:
    """The refitted constants and the predictions before and after."""
    measured = runs["measured_tokens_per_s_per_gpu"].astype(float)
    per_node = base.cluster.gpus_per_node
    only = LOCAL_PARAMS + (NETWORK_PARAMS if (runs["num_gpus"] > per_node).any() else ())
    before = predictions(runs)
    fitted, _ = fit_time(runs, measured, {base.chip: base.efficiency}, only, BOUNDS)
    constants = fitted[base.chip]
    return constants, before, predictions(runs, constants)


def predictions(runs: pd.DataFrame, constants: dict[str, float] | None = None) -> np.ndarray:
    x, errors, _ = prepare(runs)
    if (errors != "").any():
        raise UserError(f"run: a trial cannot be estimated ({errors[errors != ''].iloc[0]})")
    if constants:
        chip = catalog.get_gpu(str(runs["gpu"].iloc[0])).chip
        x = with_params(x, np.full(len(runs), chip), np.zeros(len(runs)), {chip: constants})
    with np.errstate(all="ignore"):
        return np.broadcast_to(evaluate(x)["pred_tokens_per_s_per_gpu"], (len(runs),)).copy()


def run(run_dir: Path, write: Path | None, storage: str | None = None) -> None:
    runs = measured_runs(Path(run_dir), storage)
    gpus = runs["gpu"].unique()
    if len(gpus) > 1:
        raise UserError(f"run: trials use several GPU profiles ({', '.join(gpus)})")
    base = catalog.get_gpu(str(gpus[0]))
    measured = runs["measured_tokens_per_s_per_gpu"].astype(float)
    constants, before, after = fit(runs, base)
    err_before = np.abs(before / measured.to_numpy() - 1) * 100
    err_after = np.abs(after / measured.to_numpy() - 1) * 100
    show(runs, measured, before, after, base, constants)
    Console().print(
        f"median absolute error of tokens/s/GPU on {len(runs)} trials: "
        f"{np.median(err_before):.1f}% before, {np.median(err_after):.1f}% after",
        highlight=False,
    )
    if write is not None:
        profile = calibrated_profile(base, constants, runs, run_dir, err_before, err_after)
        write.parent.mkdir(parents=True, exist_ok=True)
        tmp = write.with_name(f".{write.name}.tmp")
        tmp.write_text(yaml.safe_dump(profile, sort_keys=False))
        tmp.replace(write)
        Console(stderr=True).print(f"wrote {write}; use it with --profile {write}")


def calibrated_profile(
    base: GPUSpec,
    constants: dict[str, float],
    runs: pd.DataFrame,
    run_dir: Path,
    err_before: np.ndarray,
    err_after: np.ndarray,
) -> dict:
    data = base.model_dump(mode="json")
    eff = data["efficiency"]
    for name, value in constants.items():
        eff[name] = round(float(value), 6)
    models = ", ".join(sorted(runs["model"].unique()))
    eff["provenance"] = (
        f"fitted by autoconfig calibrate on {len(runs)} measured trials in {run_dir} "
        f"({models}; {int(runs['num_gpus'].min())}-{int(runs['num_gpus'].max())} ranks) on "
        f"{time.strftime('%Y-%m-%d')}, starting from {base.name}; refitted: "
        f"{', '.join(sorted(constants))}; median absolute error of tokens/s/GPU "
        f"{np.median(err_before):.1f}% before, {np.median(err_after):.1f}% after"
    )
    data["name"] = f"{base.name}-calibrated"
    return data


def show(
    runs: pd.DataFrame,
    measured: pd.Series,
    before: np.ndarray,
    after: np.ndarray,
    base: GPUSpec,
    constants: dict[str, float],
) -> None:
    table = Table(title=f"calibration of {base.name} on {len(runs)} trials")
    for col in ("trial", "layout", "measured", "before", "after"):
        table.add_column(col, justify="left" if col in ("trial", "layout") else "right")
    for i, r in runs.iterrows():
        layout = f"dp{r['dp']} tp{r['tp']} pp{r['pp']} mbs{r['mbs']} {r['recompute']} z{r['zero']}"
        table.add_row(
            r["run_id"],
            layout,
            f"{measured[i]:,.0f}",
            f"{before[i]:,.0f} ({100 * (before[i] / measured[i] - 1):+.0f}%)",
            f"{after[i]:,.0f} ({100 * (after[i] / measured[i] - 1):+.0f}%)",
        )
    console = Console()
    console.print(table)
    old = base.efficiency
    console.print(
        "constants: "
        + ", ".join(f"{k} {getattr(old, k)} -> {v:.4g}" for k, v in sorted(constants.items())),
        highlight=False,
    )
