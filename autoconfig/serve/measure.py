"""`autoconfig infer --measure`: the best predicted serving points generated for real with the
bundled model, through the same Optuna study, submitit executors, failure classes and resume
as the training trials (measure/). A trial is one replica (tp ranks) generating a static batch;
its value is measured output tokens/s per GPU."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from autoconfig.errors import UserError
from autoconfig.measure import session
from autoconfig.measure.candidates import DIMS, Candidates, key_of
from autoconfig.measure.session import MeasureOptions
from autoconfig.report import serving
from autoconfig.specs import ModelSpec
from autoconfig.trainer.config import TrainConfig, make_config


@dataclass
class ServeCandidates(Candidates):
    """Serving points in the training trials' vocabulary: tp, pp, and the batch as `mbs`
    (dp, cp, ep, vp 1; no recompute, no ZeRO), so the study, sampler and runner are shared."""

    input_len: int = 0
    output_len: int = 0

    def config(self, key: str) -> TrainConfig:
        row = self.by_key(key)
        return make_config(
            model=self.model,
            task="generate",
            tp=int(row["tp"]),
            pp=int(row["pp"]),
            mbs=int(row["mbs"]),
            input_len=self.input_len,
            output_len=self.output_len,
            seq_len=self.input_len + self.output_len,
            **self.overrides,
        )


def build(
    out: pd.DataFrame, model: str | ModelSpec, limit: int, overrides: dict[str, object]
) -> ServeCandidates:
    """The `limit` best points that meet the budget (or fit, when none does), as candidates."""
    pool = out[out["meets"]] if out.attrs["feasible"] else out[out["pred_fits"].astype(bool)]
    pool = pool.head(limit).reset_index(drop=True)
    a = out.attrs
    rows = []
    for i, r in pool.iterrows():
        params = {d: 1 for d in DIMS} | {
            "tp": int(r["tp"]),
            "pp": int(r["pp"]),
            "mbs": int(r["batch_size"]),
            "sp": False,
            "recompute": "none",
            "recompute_layers": 0,
            "zero": 0,
        }
        rows.append(
            {
                **params,
                "key": key_of(params),
                "label": f"tp{params['tp']} pp{params['pp']} batch {params['mbs']}",
                "pred_tokens_per_s_per_gpu": float(r["pred_output_tokens_per_s_per_gpu"]),
                "pred_step_time_s": float(r["pred_latency_ms"]) / 1e3,
                "pred_peak_mem_gb": float(r["pred_peak_mem_gb"]),
                "mem_limit_gb": float(r["mem_capacity_gb"]),
                "pred_ttft_ms": float(r["pred_ttft_ms"]),
                "pred_tpot_ms": float(r["pred_tpot_ms"]),
                "analytical_rank": int(i) + 1,
                "refused": "",
            }
        )
    table = pd.DataFrame(rows)
    cands = ServeCandidates(
        table,
        model,
        a["input_len"] + a["output_len"],
        0,
        dict(overrides),
        input_len=a["input_len"],
        output_len=a["output_len"],
    )
    for i, key in enumerate(table["key"]):
        try:
            cands.config(key)
        except UserError as exc:
            table.loc[i, "refused"] = str(exc)
    grid = table.sort_values(list(DIMS), kind="stable").index
    table["grid_order"] = 0
    table.loc[grid, "grid_order"] = range(len(table))
    return cands


def run(out: pd.DataFrame, model: str | ModelSpec, gpu: str, opts: MeasureOptions) -> int:
    """Measure the best serving points of `out`; returns the exit code (0: something ran)."""
    settings = session.check_options(opts)
    device = session.resolve_device(opts.device)
    cands = build(out, model, opts.candidates, session.trial_overrides(opts, device, gpu))
    if cands.runnable().empty:
        reason = cands.table["refused"].iloc[0] if len(cands.table) else "no candidate fits"
        raise UserError(f"measure: the bundled generator can run none of the points ({reason})")
    a = out.attrs
    fingerprint = {
        "task": "serve",
        "model": str(a["model"]),
        "gpus": int(a["gpus"]),
        "gpu": gpu,
        "input_len": int(a["input_len"]),
        "output_len": int(a["output_len"]),
    }
    trials, ranking, study = session.measure(
        cands, opts, settings, device, fingerprint, "serving points"
    )
    trials = _with_phases(trials, study)
    serving.write(out, opts.out, trials=trials, ranking=ranking)
    return session.finish(opts, trials, ranking)


def _with_phases(trials: pd.DataFrame, study) -> pd.DataFrame:
    """Measured and predicted TTFT/TPOT beside the throughput of each trial."""
    if trials.empty:
        return trials
    by_number = {t.number: t.user_attrs for t in study.get_trials(deepcopy=False)}
    for col in ("measured_ttft_ms", "measured_tpot_ms", "pred_ttft_ms", "pred_tpot_ms"):
        trials[col] = trials["trial"].map(lambda n, c=col: by_number.get(n, {}).get(c))
    return trials
