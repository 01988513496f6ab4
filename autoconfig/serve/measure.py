"""`autoconfig infer --measure`: the best predicted serving points generated for real with the
bundled model, through the same Optuna study, submitit executors, failure classes and resume
as the training trials (measure/). A trial is one replica (tp ranks) generating a static batch;
its value is measured output tokens/s per GPU."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
from rich.console import Console

from autoconfig.errors import UserError
from autoconfig.measure import summary
from autoconfig.measure.candidates import DIMS, Candidates, key_of
from autoconfig.measure.launcher import Launcher
from autoconfig.measure.progress import Progress
from autoconfig.measure.runner import Runner, Settings, check_settings
from autoconfig.measure.sampler import SAMPLERS, CandidateSampler
from autoconfig.measure.session import MeasureOptions, faults_from_env, resolve_device
from autoconfig.measure.study import enqueue_top, open_storage, open_study, storage_url
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
    if opts.sampler not in SAMPLERS:
        raise UserError(f"sampler: '{opts.sampler}' is not one of {', '.join(SAMPLERS)}")
    if opts.executor not in ("local", "slurm"):
        raise UserError(f"executor: '{opts.executor}' is not one of local, slurm")
    settings = Settings(
        trials=opts.trials,
        parallel=opts.parallel,
        budget_gpu_hours=opts.budget_gpu_hours,
        timeout_s=opts.timeout_min * 60,
        faults=faults_from_env(),
    )
    check_settings(settings)
    device = resolve_device(opts.device)
    overrides: dict[str, object] = {
        "steps": opts.steps,
        "warmup": opts.warmup,
        "device": device,
        "gpu": gpu,
    }
    if opts.trial_memory_gb is not None:
        overrides["memory_limit_gb"] = opts.trial_memory_gb
    cands = build(out, model, opts.candidates, overrides)
    runnable = cands.runnable()
    if runnable.empty:
        reason = cands.table["refused"].iloc[0] if len(cands.table) else "no candidate fits"
        raise UserError(f"measure: the bundled generator can run none of the points ({reason})")
    launcher = Launcher(opts.executor, settings.timeout_s, device, opts.slurm)
    launcher.preflight([int(t) for t in runnable["tp"]])
    url = storage_url(opts.out, opts.storage)
    if opts.storage is None:
        opts.out.mkdir(parents=True, exist_ok=True)
    storage = open_storage(url)
    a = out.attrs
    fingerprint = {
        "task": "serve",
        "model": str(a["model"]),
        "gpus": int(a["gpus"]),
        "gpu": gpu,
        "input_len": int(a["input_len"]),
        "output_len": int(a["output_len"]),
        "space": cands.fingerprint(),
        "steps": opts.steps,
        "device": device,
    }
    sampler = CandidateSampler(cands.table, opts.sampler, opts.seed, startup=max(opts.top_k, 1))
    study = open_study(storage, fingerprint, opts.resume, sampler, str(opts.out))
    console = Console(stderr=True)
    with Progress(console) as progress:
        runner = Runner(study, cands, launcher, settings, opts.out, progress)
        if not opts.resume:
            runner.record_refused_top()
            queued = enqueue_top(study, cands, min(opts.top_k, opts.trials))
            console.print(
                f"measuring up to {opts.trials} of {len(runnable)} runnable serving points "
                f"({opts.executor}, {device}); analytical top {len(queued)} first, then "
                f"{opts.sampler}; study in {url}",
                highlight=False,
            )
        else:
            console.print(f"resuming: {len(runner.finished())} finished trial(s) kept")
        runner.run()
    trials = _with_phases(summary.trials_frame(study), study)
    ranking = summary.ranking(cands, trials)
    serving.write(out, opts.out, trials=trials, ranking=ranking)
    summary.show(ranking, trials, 10, Console())
    console.print(f"wrote {opts.out}/trials.csv, measured.csv and report.html", highlight=False)
    return 0 if len(trials) and bool((trials["class"] == "ok").any()) else 1


def _with_phases(trials: pd.DataFrame, study) -> pd.DataFrame:
    """Measured and predicted TTFT/TPOT beside the throughput of each trial."""
    if trials.empty:
        return trials
    by_number = {t.number: t.user_attrs for t in study.get_trials(deepcopy=False)}
    for col in ("measured_ttft_ms", "measured_tpot_ms", "pred_ttft_ms", "pred_tpot_ms"):
        trials[col] = trials["trial"].map(lambda n, c=col: by_number.get(n, {}).get(c))
    return trials
