"""The measured search's ranking: measured throughput where a layout was measured, the
prediction otherwise (scaled by the median measured/predicted ratio, so the two are comparable),
side by side with the model's error; failures at the bottom with their class and reason."""

from __future__ import annotations

import statistics

import optuna
import pandas as pd
from optuna.trial import TrialState

from autoconfig.measure.candidates import Candidates
from autoconfig.spec.vocab import FailureClass

COLUMNS = [
    "trial",
    "state",
    "class",
    "key",
    "layout",
    "source",
    "analytical_rank",
    "pred_tokens_per_s_per_gpu",
    "measured_tokens_per_s_per_gpu",
    "error_pct",
    "pred_peak_mem_gib",
    "measured_peak_mem_gib",
    "run_pred_tokens_per_s_per_gpu",
    "run_pred_peak_mem_gib",
    "wall_s",
    "overhead_s",
    "reason",
    "rerun_after",
    "run_dir",
]


def trials_frame(study: optuna.Study) -> pd.DataFrame:
    """One row per trial with its layout, state, class, reason and figures (trials.csv)."""
    rows = []
    for t in study.get_trials(deepcopy=False):
        if t.state == TrialState.WAITING:
            continue
        a = t.user_attrs
        rows.append(
            {
                "trial": t.number,
                "state": t.state.name.lower(),
                "class": a.get("failure_class", "running" if t.state == TrialState.RUNNING else ""),
                "key": a.get("key", ""),
                "layout": a.get("label", ""),
                "source": a.get("source", "sampler"),
                "analytical_rank": a.get("analytical_rank"),
                "pred_tokens_per_s_per_gpu": a.get("pred_tokens_per_s_per_gpu"),
                "measured_tokens_per_s_per_gpu": t.value
                if t.state == TrialState.COMPLETE
                else None,
                "error_pct": _error(a.get("pred_tokens_per_s_per_gpu"), t.value)
                if t.state == TrialState.COMPLETE
                else None,
                "pred_peak_mem_gib": a.get("pred_peak_mem_gib"),
                "measured_peak_mem_gib": a.get("measured_peak_mem_gib"),
                "run_pred_tokens_per_s_per_gpu": a.get("run_pred_tokens_per_s_per_gpu"),
                "run_pred_peak_mem_gib": a.get("run_pred_peak_mem_gib"),
                "wall_s": a.get("wall_s"),
                "overhead_s": a.get("overhead_s"),
                "reason": a.get("reason", ""),
                "rerun_after": a.get("rerun_after", ""),
                "run_dir": a.get("run_dir", ""),
            }
        )
    return pd.DataFrame(rows, columns=COLUMNS)


def _error(pred: float | None, measured: float | None) -> float | None:
    if not pred or not measured:
        return None
    return 100.0 * (pred - measured) / measured


def ranking(candidates: Candidates, trials: pd.DataFrame) -> pd.DataFrame:
    """Every candidate, best first by measured-else-scaled-predicted throughput."""
    table = candidates.table[["key", "label", "analytical_rank", "pred_tokens_per_s_per_gpu"]]
    table = table.copy()
    # A layout's verdict is its last trial that says something: an interrupted trial (re-run
    # later) or a running one does not hide a finished result.
    said = trials[~trials["class"].isin(["", "running", FailureClass.INTERRUPTED.value])]
    last = said.drop_duplicates("key", keep="last").set_index("key")
    table["class"] = table["key"].map(last["class"]).fillna("").astype(str)
    table["measured_tokens_per_s_per_gpu"] = pd.to_numeric(
        table["key"].map(last["measured_tokens_per_s_per_gpu"]), errors="coerce"
    ).astype(float)
    table["reason"] = table["key"].map(last["reason"]).fillna("").astype(str)
    measured = table["measured_tokens_per_s_per_gpu"].notna()
    ratios = (
        table.loc[measured, "measured_tokens_per_s_per_gpu"]
        / table.loc[measured, "pred_tokens_per_s_per_gpu"]
    )
    scale = statistics.median(ratios) if len(ratios) else 1.0
    table["scaled_pred_tokens_per_s_per_gpu"] = table["pred_tokens_per_s_per_gpu"] * scale
    table["ranked_by"] = measured.map({True: "measured", False: "predicted"})
    failed = table["class"].isin([c.value for c in FailureClass if c.failed])
    table.loc[failed, "ranked_by"] = table.loc[failed, "class"]
    table["score"] = table["measured_tokens_per_s_per_gpu"].where(
        measured, table["scaled_pred_tokens_per_s_per_gpu"]
    )
    table.loc[failed, "score"] = -1.0
    table["error_pct"] = 100.0 * (
        table["pred_tokens_per_s_per_gpu"] / table["measured_tokens_per_s_per_gpu"] - 1.0
    )
    table = table.sort_values(["score", "analytical_rank"], ascending=[False, True])
    table.insert(0, "rank", range(1, len(table) + 1))
    return table.reset_index(drop=True)
