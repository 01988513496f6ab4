"""`autoconfig infer --measure`: the best predicted serving points generated for real with the
bundled model, through the same Optuna study, submitit executors, failure classes and resume
as the training trials. A trial is one replica (tp ranks) generating a static batch, or, for
continuous batching, serving the simulated request trace at the replica's share of the
operating rate (trainer/serve_loop.py); its value is measured output tokens/s per GPU, and
the TTFT / TPOT percentiles stand beside the simulated ones."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from autoconfig.base.errors import UserError
from autoconfig.measure import session, summary
from autoconfig.measure.candidates import Candidates, with_grid_order
from autoconfig.measure.result import MeasuredSearch
from autoconfig.measure.session import MeasureOptions
from autoconfig.serve.request import Request
from autoconfig.serve.result import ServingResult
from autoconfig.spec import layout
from autoconfig.spec.schema import ModelSpec
from autoconfig.spec.vocab import FailureClass
from autoconfig.trainer.config import TrainConfig, make_config
from autoconfig.trainer.serve_loop import LOAD_ENV, ServeLoad

PERCENTILES = (50, 90, 99)
METRICS = ("ttft", "tpot", "latency")
# A trial that ran and was measured, whose measured TTFT, TPOT or latency misses the limits.
# Not a FailureClass: the run itself succeeded (the study keeps it "ok", so --resume does not
# run it again); it is the serving search's verdict on what the run measured.
MISSED_SLO = "missed_slo"


@dataclass
class MeasuredServing(MeasuredSearch):
    """A measured serving search: the trials that missed the limits counted as their own
    class, and named when no trial met them."""

    def counts(self) -> dict[str, int]:
        out = super().counts()
        missed = int((self.trials["class"] == MISSED_SLO).sum()) if len(self.trials) else 0
        if missed:
            out[MISSED_SLO] = missed
        return out

    def diagnosis(self) -> list[str]:
        lines = super().diagnosis()
        missed = self.trials[self.trials["class"] == MISSED_SLO] if len(self.trials) else None
        if lines and missed is not None and len(missed):
            reason = str(missed["reason"].iloc[0])[:200]
            lines.insert(
                1,
                f"  {MISSED_SLO} ({len(missed)}): {reason}; the predictions met the limits, the "
                "measurements did not: compare measured and predicted in trials.csv",
            )
        return lines


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
    if result.request.batching == "continuous":
        return build_continuous(result, model, limit, overrides)
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
                "pred_peak_mem_gib": float(r["pred_peak_mem_gib"]),
                "mem_limit_gib": float(r["mem_capacity_gib"]),
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


def build_continuous(
    result: ServingResult, model: str | ModelSpec, limit: int, overrides: dict[str, object]
) -> ServeCandidates:
    """The best simulated deployments (those that meet the limits first), one trial per
    (tp, max-num-seqs): a replica serving its share of the operating rate."""
    out = result.table
    pool = out[out["simulated"].astype(bool) & (out["mode"] == "colocated")]
    pool = pool[pool["meets"]] if pool["meets"].any() else pool
    pool = pool.drop_duplicates(["tp", "pp", "max_num_seqs"]).head(limit)
    req = result.request
    trace = req.workload.trace() if req.workload is not None else None
    if trace is None:
        raise UserError("measure: continuous batching needs the simulated workload")
    p = f"p{req.percentile:g}"
    rows = []
    replica = layout.plain(layout.Layout(zero=0).model_dump())
    for i, (_, r) in enumerate(pool.reset_index(drop=True).iterrows()):
        params = replica | {"tp": int(r["tp"]), "pp": int(r["pp"]), "mbs": int(r["max_num_seqs"])}
        rate = float(r["rate_rps"]) / max(float(r["replicas"]), 1.0)
        rows.append(
            {
                **params,
                "key": layout.key(params),
                "label": (
                    f"tp{params['tp']} pp{params['pp']} seqs {params['mbs']} tokens "
                    f"{int(r['max_num_batched_tokens'])} at {rate:.2f} req/s per replica"
                ),
                "pred_tokens_per_s_per_gpu": float(r["pred_output_tokens_per_s_per_gpu"]),
                "pred_step_time_s": float(r["pred_latency_ms"]) / 1e3,
                "pred_peak_mem_gib": float(r["weights_gib"] + r["kv_cache_gib"]),
                "mem_limit_gib": float(result.gpu.memory_gib),
                "pred_ttft_ms": float(r[f"ttft_{p}_ms"]),
                "pred_tpot_ms": float(r[f"tpot_{p}_ms"]),
                **{
                    f"pred_{m}_p{q}_ms": float(r[f"{m}_p{q}_ms"])
                    for m in METRICS
                    for q in PERCENTILES
                },
                "rate": rate,
                "max_tokens": int(r["max_num_batched_tokens"]),
                "analytical_rank": i + 1,
                "refused": "",
            }
        )
    table = with_grid_order(pd.DataFrame(rows).drop_duplicates("key", ignore_index=True))
    cands = ServeCandidates(
        table,
        model,
        int(trace.input_len.max() + trace.output_len.max()),
        0,
        dict(overrides),
        input_len=int(trace.input_len.max()),
        output_len=int(trace.output_len.max()),
    )
    for i, key in enumerate(table["key"]):
        try:
            cands.config(key)
        except UserError as exc:
            table.loc[i, "refused"] = str(exc)
    loads: dict[str, dict[str, float]] = {}
    for _, row in table[table["refused"] == ""].iterrows():
        loads.setdefault(
            ServeLoad.key(int(row["tp"]), int(row["mbs"])),
            {"rate": row["rate"], "max_tokens": row["max_tokens"]},
        )
    # The trials' load reaches their ranks through the environment the executors pass on.
    os.environ[LOAD_ENV] = json.dumps(
        {
            "arrivals": trace.arrival.tolist(),
            "inputs": trace.input_len.astype(int).tolist(),
            "outputs": trace.output_len.astype(int).tolist(),
            "layouts": loads,
        }
    )
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
    if req.batching == "continuous":
        fingerprint |= {"workload": req.workload.describe() if req.workload else ""}
    try:
        trials, _, study = session.measure(
            cands, opts, settings, device, fingerprint, "serving points"
        )
    finally:
        os.environ.pop(LOAD_ENV, None)
    trials = _with_slo(_with_percentiles(_with_phases(trials, study), cands.table), req)
    return MeasuredServing(trials, _met_first(summary.ranking(cands, trials)))


def _with_phases(trials: pd.DataFrame, study) -> pd.DataFrame:
    """Measured and predicted TTFT/TPOT (and a static batch's measured latency, its
    generation's time) beside the throughput of each trial."""
    if trials.empty:
        return trials
    by_number = {t.number: t.user_attrs for t in study.get_trials(deepcopy=False)}
    for col in (
        "measured_ttft_ms",
        "measured_tpot_ms",
        "measured_step_time_s",
        "pred_ttft_ms",
        "pred_tpot_ms",
    ):
        trials[col] = trials["trial"].map(lambda n, c=col: by_number.get(n, {}).get(c))
    return trials


def _measured(trial: pd.Series, metric: str, percentile: float) -> float:
    """A trial's measured metric in ms at the percentile of the limits (nan: not measured).
    A continuous-batching trial reports p50/p90/p99; another percentile is interpolated
    between them (held at the ends). A static batch's figures are its generations' median:
    every sequence of a batch shares them, so they stand for every percentile."""
    if f"measured_{metric}_p50_ms" in trial.index:  # continuous batching
        measured = np.array([trial[f"measured_{metric}_p{q}_ms"] for q in PERCENTILES], float)
        if np.isnan(measured).any():
            return np.nan
        return float(np.interp(percentile, PERCENTILES, measured))
    if metric == "latency":
        step = trial.get("measured_step_time_s")
        return np.nan if step is None or pd.isna(step) else 1e3 * float(step)
    value = trial.get(f"measured_{metric}_ms")
    return np.nan if value is None or pd.isna(value) else float(value)


def slo_misses(trial: pd.Series, req: Request) -> list[str]:
    """Each limit the trial's measured figures miss at the request's percentile, in words."""
    b = req.budget
    # a static batch's sequences share their figures: no percentile to name
    p = "" if req.batching == "static" else f" p{req.percentile:g}"
    found = []
    for metric, label, limit in (
        ("ttft", "TTFT", b.max_ttft_ms),
        ("tpot", "TPOT", b.max_tpot_ms),
        ("latency", "latency", b.max_latency_ms),
    ):
        value = _measured(trial, metric, req.percentile)
        if limit is not None and value > limit:  # nan: not measured, no verdict
            found.append(f"measured {label}{p} {value:,.1f} ms > {limit:,g} ms")
    return found


def _with_slo(trials: pd.DataFrame, req: Request) -> pd.DataFrame:
    """Trials that ran but whose measured percentiles miss the limits: class MISSED_SLO, the
    misses as the reason."""
    if trials.empty:
        return trials
    for i, trial in trials[trials["class"] == FailureClass.OK.value].iterrows():
        misses = slo_misses(trial, req)
        if misses:
            trials.loc[i, "class"] = MISSED_SLO
            trials.loc[i, "reason"] = "; ".join(misses)
    return trials


def _met_first(ranking: pd.DataFrame) -> pd.DataFrame:
    """The ranking with the deployments measured beyond the limits below every other that
    did not fail (they do not deliver what was asked, whatever their throughput), renumbered."""
    failed = ranking["class"].isin([c.value for c in FailureClass if c.failed])
    missed = ranking["class"] == MISSED_SLO
    order = np.select([failed.to_numpy(), missed.to_numpy()], [2, 1], 0)
    out = ranking.assign(_order=order).sort_values("_order", kind="stable").drop(columns="_order")
    out["rank"] = range(1, len(out) + 1)
    return out.reset_index(drop=True)


def _with_percentiles(trials: pd.DataFrame, candidates: pd.DataFrame) -> pd.DataFrame:
    """Continuous-batching trials: measured TTFT / TPOT percentiles (rank 0's result) beside
    the simulated ones."""
    if trials.empty or "pred_ttft_p90_ms" not in candidates:
        return trials
    by_key = candidates.set_index("key")
    for m in METRICS:
        for q in PERCENTILES:
            column = f"pred_{m}_p{q}_ms"
            trials[column] = trials["key"].map(by_key[column])
            trials[f"measured_{m}_p{q}_ms"] = float("nan")
    for i, row in trials.iterrows():
        folder = row.get("run_dir") or ""
        result = Path(folder) / "rank0.json" if folder else None
        if result is None or not result.is_file():
            continue
        serve = json.loads(result.read_text()).get("serve")
        if not serve:
            continue
        for m in METRICS:
            for q in PERCENTILES:
                trials.loc[i, f"measured_{m}_p{q}_ms"] = serve.get(f"{m}_p{q}_ms", np.nan)
    return trials
