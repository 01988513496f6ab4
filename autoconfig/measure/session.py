"""`autoconfig search --measure`: from the analytical ranking to a finished study, returned as
a MeasuredSearch for the layer above to report. Every check that can refuse the request
(options, storage, SLURM options, a resumed folder of another search) runs before the study is
touched."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import optuna
import pandas as pd
from rich.console import Console

from autoconfig.base import checks
from autoconfig.base.errors import UserError
from autoconfig.base.folderlock import folder_lock
from autoconfig.layout_search.result import SearchResult
from autoconfig.measure import candidates as cand
from autoconfig.measure import ray_executor, summary
from autoconfig.measure.launcher import Launcher, SlurmOptions
from autoconfig.measure.progress import Progress
from autoconfig.measure.result import MeasuredSearch
from autoconfig.measure.runner import MAX_MINUTES, Runner, Settings, check_settings
from autoconfig.measure.sampler import CandidateSampler
from autoconfig.measure.study import (
    ENDED,
    STUDY_FILE,
    enqueue_top,
    masked,
    open_storage,
    open_study,
    storage_url,
)
from autoconfig.spec import machine
from autoconfig.spec.vocab import Executor, Sampler
from autoconfig.trainer.prediction import runs_fp32

FAULTS_ENV = "AUTOCONFIG_MEASURE_FAULTS"  # testing: "1:alloc@0,2:sleep@0" trial -> fault


@dataclass
class MeasureOptions:
    out: Path
    trials: int = 8
    sampler: str = "model"
    executor: str = "local"
    device: str = "auto"
    parallel: int = 1
    steps: int = 10
    warmup: int = 2
    timeout_min: float = 15.0
    budget_gpu_hours: float | None = None
    top_k: int = 3
    candidates: int = 200
    storage: str | None = None
    resume: bool = False
    trial_memory_gib: float | None = None
    capacity_factor: float | None = None  # MoE trials: the experts' token capacity
    seed: int = 0
    slurm: SlurmOptions = field(default_factory=SlurmOptions)
    ray: ray_executor.RayOptions = field(default_factory=ray_executor.RayOptions)


def resolve_device(device: str) -> str:
    return machine.resolve(device).value


MAX_STEPS = 1_000_000
MAX_CANDIDATES = 1_000_000


def check_options(opts: MeasureOptions) -> Settings:
    """Every option check that can refuse the request, before anything is built or touched."""
    Sampler.parse(opts.sampler, "sampler")
    if Executor.parse(opts.executor, "executor") is Executor.RAY:
        ray_executor.load_ray()  # not installed: one line before any work
    elif opts.ray.address is not None:
        raise UserError("ray-address: only with --executor ray")
    opts.steps = checks.integer(opts.steps, "steps", 1, MAX_STEPS)
    opts.warmup = checks.integer(opts.warmup, "warmup", 0, MAX_STEPS)
    if opts.warmup >= opts.steps:
        raise UserError(
            f"warmup: {opts.warmup} steps leave none of the {opts.steps} to time; "
            f"use fewer than --steps"
        )
    opts.top_k = checks.integer(opts.top_k, "enqueue-top", 0, MAX_CANDIDATES)
    opts.candidates = checks.integer(opts.candidates, "candidates", 1, MAX_CANDIDATES)
    opts.seed = checks.integer(opts.seed, "seed", 0, 2**32 - 1)
    if opts.trial_memory_gib is not None:
        opts.trial_memory_gib = checks.number(opts.trial_memory_gib, "trial-memory-gib", 0, 2**20)
    opts.timeout_min = checks.number(opts.timeout_min, "trial-timeout-min", 0, MAX_MINUTES)
    settings = Settings(
        trials=opts.trials,
        parallel=opts.parallel,
        budget_gpu_hours=opts.budget_gpu_hours,
        timeout_s=opts.timeout_min * 60,
        faults=faults_from_env(),
    )
    return check_settings(settings)


def trial_overrides(opts: MeasureOptions, device: str, gpu: str) -> dict[str, object]:
    """What every trial's run configuration takes from the options."""
    overrides: dict[str, object] = {
        "steps": opts.steps,
        "warmup": opts.warmup,
        "device": device,
        "gpu": gpu,
    }
    if opts.trial_memory_gib is not None:
        overrides["memory_limit_gib"] = opts.trial_memory_gib
    if opts.capacity_factor is not None:
        overrides["capacity_factor"] = opts.capacity_factor
    return overrides


def measure(
    table: cand.Candidates,
    opts: MeasureOptions,
    settings: Settings,
    device: str,
    fingerprint: dict[str, object],
    what: str,
) -> tuple[pd.DataFrame, pd.DataFrame, optuna.Study]:
    """Run (or resume) the study over `table`'s runnable candidates; returns the trials, the
    measured-else-predicted ranking and the study. `what` names the candidates in messages."""
    runnable = table.runnable()
    worlds = [int(c.tp * c.pp * c.dp * c.cp) for c in runnable.itertuples()]
    launcher = Launcher(opts.executor, settings.timeout_s, device, opts.slurm, ray=opts.ray)
    if worlds:
        launcher.preflight(worlds)
    url = storage_url(opts.out, opts.storage)
    if opts.resume and opts.storage is None and not (opts.out / STUDY_FILE).exists():
        raise UserError(f"resume: no measured search in {opts.out} to resume")  # nothing made
    fingerprint = {**fingerprint, "space": table.fingerprint(), "steps": opts.steps}
    fingerprint["device"] = device
    sampler = CandidateSampler(table.table, opts.sampler, opts.seed, startup=max(opts.top_k, 1))
    console = Console(stderr=True)
    with folder_lock(opts.out), stop_on_sigterm():
        storage = open_storage(url)
        study = open_study(storage, fingerprint, opts.resume, sampler, str(opts.out))
        with Progress(console) as progress:
            runner = Runner(study, storage, table, launcher, settings, opts.out, progress)
            if not seeded(study):  # a new study (or one whose first run died starting)
                runner.record_refused_top()
                queued = enqueue_top(study, table, min(opts.top_k, opts.trials))
                study.set_user_attr("seeded", True)
                console.print(
                    f"measuring up to {opts.trials} of {len(runnable)} runnable {what} "
                    f"({opts.executor}, {device}); analytical top {len(queued)} first, then "
                    f"{opts.sampler}; study in {masked(url)}",
                    highlight=False,
                )
            else:
                done = len(runner.finished())
                console.print(f"resuming: {done} finished trial(s) kept", highlight=False)
            study.set_user_attr(ENDED, False)
            runner.run()
            study.set_user_attr(ENDED, True)
        trials = summary.trials_frame(study)
    return trials, summary.ranking(table, trials), study


def seeded(study: optuna.Study) -> bool:
    """Whether the study's first trials (refused top layouts, analytical top-k) are in."""
    return bool(study.user_attrs.get("seeded")) or any(
        t.user_attrs.get("source") == "analytical top-k" for t in study.get_trials(deepcopy=False)
    )


@contextlib.contextmanager
def stop_on_sigterm() -> Iterator[None]:
    """SIGTERM (a scheduler ending the search's own job, `kill`) stops the search as Ctrl-C
    does: local trials are killed, the study keeps everything, --resume goes on."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run(result: SearchResult, model: str, gpu: str, opts: MeasureOptions) -> MeasuredSearch:
    """Measure the best candidates of a search."""
    settings = check_options(opts)
    device = resolve_device(opts.device)
    if not result.feasible:
        raise UserError("measure: no layout fits in memory, so there is nothing to measure")
    overrides = trial_overrides(opts, device, gpu)
    table = cand.build(result, model, opts.candidates, overrides)
    r = result.request
    fingerprint = {
        "model": r.model.name,
        "gpus": int(r.gpus),
        "gpu": gpu,
        "seq_len": int(r.seq_len),
        "gbs": int(r.gbs),
        "precision": str(r.precision),
    }
    trials, ranking, _ = measure(table, opts, settings, device, fingerprint, "candidates")
    runnable = table.runnable()
    ran = ""
    if len(runnable):
        ran = "fp32" if runs_fp32(table.config(runnable["key"].iloc[0]), device) else "bf16"
    return MeasuredSearch(trials, ranking, ran)


def faults_from_env() -> dict[int, str]:
    spec = os.environ.get(FAULTS_ENV, "")
    out = {}
    for item in filter(None, spec.split(",")):
        number, _, fault = item.partition(":")
        out[int(number)] = fault
    return out
