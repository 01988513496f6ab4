"""`autoconfig infer --measure`: the best predicted serving points generated for real with the
bundled model, through the same Optuna study, submitit executors, failure classes and resume
as the training trials. A trial is one replica (tp ranks) generating a static batch; its value
is measured output tokens/s per GPU."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from autoconfig import layout
from autoconfig.errors import UserError
from autoconfig.measure import session
from autoconfig.measure.candidates import Candidates, with_grid_order
from autoconfig.measure.result import MeasuredSearch
from autoconfig.measure.session import MeasureOptions
from autoconfig.serve.result import ServingResult
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
    result: ServingResult, model: str | ModelSpec, limit: int, overrides: dict[str, object]
) -> ServeCandidates:
    """The `limit` best points that meet the budget (or fit, when none does), as candidates."""
    out = result.table
    pool = out[out["meets"]] if result.feasible else out[out["pred_fits"].astype(bool)]
    pool = pool.head(limit).reset_index(drop=True)
    req = result.request
    rows = []
    replica = layout.plain(layout.Layout(zero=0).model_dump())
    for i, r in pool.iterrows():
        params = replica | {"tp": int(r["tp"]), "pp": int(r["pp"]), "mbs": int(r["batch_size"])}
        rows.append(
            {
                **params,
                "key": layout.key(params),
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
    table = with_grid_order(pd.DataFrame(rows))
    cands = ServeCandidates(
        table,
        model,
        req.input_len + req.output_len,
        0,
        dict(overrides),
        input_len=req.input_len,
        output_len=req.output_len,
    )
    for i, key in enumerate(table["key"]):
        try:
            cands.config(key)
        except UserError as exc:
            table.loc[i, "refused"] = str(exc)
    return cands


def run(
    result: ServingResult, model: str | ModelSpec, gpu: str, opts: MeasureOptions
) -> MeasuredSearch:
    """Measure the best serving points of a serving search."""
    settings = session.check_options(opts)
    device = session.resolve_device(opts.device)
    cands = build(result, model, opts.candidates, session.trial_overrides(opts, device, gpu))
    if cands.runnable().empty:
        reason = cands.table["refused"].iloc[0] if len(cands.table) else "no candidate fits"
        raise UserError(f"measure: the bundled generator can run none of the points ({reason})")
    req = result.request
    fingerprint = {
        "task": "serve",
        "model": result.model.name,
        "gpus": int(req.gpus),
        "gpu": gpu,
        "input_len": int(req.input_len),
        "output_len": int(req.output_len),
    }
    trials, ranking, study = session.measure(
        cands, opts, settings, device, fingerprint, "serving points"
    )
    return MeasuredSearch(_with_phases(trials, study), ranking)


def _with_phases(trials: pd.DataFrame, study) -> pd.DataFrame:
    """Measured and predicted TTFT/TPOT beside the throughput of each trial."""
    if trials.empty:
        return trials
    by_number = {t.number: t.user_attrs for t in study.get_trials(deepcopy=False)}
    for col in ("measured_ttft_ms", "measured_tpot_ms", "pred_ttft_ms", "pred_tpot_ms"):
        trials[col] = trials["trial"].map(lambda n, c=col: by_number.get(n, {}).get(c))
    return trials
