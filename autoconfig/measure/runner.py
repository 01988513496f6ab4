"""The measured search's loop: ask the study for a layout, launch it, watch it (timeouts
included), classify and tell what came back, up to --trials, --budget-gpu-hours and --parallel.
Everything a trial learns is in the study before the next decision, so a killed search loses
nothing that finished."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import optuna
import pandas as pd
from optuna.trial import TrialState, create_trial

from autoconfig.base import checks
from autoconfig.base.fileio import write_json
from autoconfig.measure.candidates import PREDICTED, Candidates
from autoconfig.measure.launcher import Job, Launcher, LaunchError
from autoconfig.measure.outcome import (
    Outcome,
    all_ranks_done,
    collect,
    finished_on_disk,
    lost_a_rank,
    only_collateral,
)
from autoconfig.measure.progress import Progress
from autoconfig.measure.sampler import chosen_layout, distributions, taken_keys
from autoconfig.spec import layout
from autoconfig.spec.vocab import FailureClass
from autoconfig.trainer.config import TrainConfig
from autoconfig.trainer.metrics import RunMetrics

POLL_S = 0.1
KILL_GRACE_S = 10.0
MAX_TRIALS = 100_000
MAX_MINUTES = 7 * 24 * 60.0  # a week: a trial limit beyond it is a typo
STOPPED = "the search stopped while this trial ran; --resume re-runs its layout once"


def memory_verdict(attrs: dict, metrics: RunMetrics | None) -> str:
    """What the cost model had said of an out-of-memory trial's peak. The trial's own
    prediction (metrics.json: the run as the trainer launched it, under autocast on GPU, in
    fp32 on CPU) is the like-for-like figure; the search's, for the framework it ranks for,
    stands in when the run left none."""
    cap, searched = attrs.get("mem_limit_gib"), attrs.get("pred_peak_mem_gib")
    own = (metrics.predicted or {}).get("pred_peak_mem_gib") if metrics is not None else None
    pred = own if own is not None else searched
    if pred is None or cap is None:
        return ""
    if pred <= cap:
        return (
            f" (the cost model said it fits: {pred:.2f} of {cap:.2f} GiB; "
            "its memory verdict was wrong here)"
        )
    if own is None or searched is None:
        return f" (the cost model put it at {pred:.2f} GiB, over the {cap:.2f} GiB limit)"
    return (
        f" (the cost model put the run as launched at {pred:.2f} GiB, over the {cap:.2f} GiB "
        f"limit; the search's {searched:.2f} GiB is for the framework it ranks for)"
    )


@dataclass
class Settings:
    trials: int
    parallel: int = 1
    budget_gpu_hours: float | None = None
    timeout_s: float = 900.0
    faults: dict[int, str] | None = None  # testing: trial number -> trainer fault


@dataclass
class Flight:
    trial: optuna.trial.Trial
    key: str
    cfg: TrainConfig
    job: Job
    run_dir: Path
    timed_out_at: float | None = None


class Runner:
    def __init__(
        self,
        study: optuna.Study,
        storage: optuna.storages.BaseStorage,
        candidates: Candidates,
        launcher: Launcher,
        settings: Settings,
        out: Path,
        progress: Progress,
    ) -> None:
        self.study, self.storage = study, storage
        self.candidates, self.launcher = candidates, launcher
        self.settings, self.out, self.progress = settings, Path(out), progress
        self.space = distributions(candidates.table)
        self._keys = set(candidates.table["key"])
        # Trial folders of a restarted study (study.py archives one that never succeeded) get
        # a prefix, so they do not overwrite the earlier attempt's.
        attempt = int(study.user_attrs.get("attempt", 0))
        self.prefix = f"a{attempt}-" if attempt else ""
        self.flights: dict[int, Flight] = {}
        self.draining: list[tuple[Job, float]] = []  # finished jobs whose processes still exit

    # -- accounting -------------------------------------------------------------------------
    def finished(self) -> list[optuna.trial.FrozenTrial]:
        return [
            t
            for t in self.study.get_trials(deepcopy=False)
            if t.state.is_finished() and _counted(t.user_attrs.get("failure_class"))
        ]

    def gpu_hours(self) -> float:
        return sum(
            (float(t.user_attrs.get("wall_s", 0)) + float(t.user_attrs.get("lost_wall_s", 0)))
            * int(t.user_attrs.get("world", 1))
            / 3600
            for t in self.study.get_trials(deepcopy=False)
        )

    def _ranks_in_flight(self) -> int:
        return sum(f.cfg.world for f in self.flights.values())

    def _untried(self) -> int:
        taken = taken_keys(self.study)
        runnable = self.candidates.runnable()
        return int((~runnable["key"].isin(taken)).sum())

    def _waiting(self) -> int:
        return len(self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))

    def budget_left(self) -> bool:
        s = self.settings
        if len(self.finished()) + len(self.flights) >= s.trials:
            return False
        if s.budget_gpu_hours is not None and self.gpu_hours() >= s.budget_gpu_hours:
            return False
        return self._untried() + self._waiting() > 0

    # -- the loop -----------------------------------------------------------------------------
    def run(self) -> None:
        self.recover()
        try:
            while True:
                self._poll()
                while len(self.flights) < self.settings.parallel and self.budget_left():
                    if not self._launch_next():
                        break
                if not self.flights and not self.budget_left():
                    break
                self.progress.refresh(self)
                time.sleep(POLL_S)
        except KeyboardInterrupt:
            self.abandon()
            raise
        self.progress.refresh(self)

    def _launch_next(self) -> bool:
        """Ask for one layout and start it; False when none can start now."""
        nxt = self._peek_world()
        if nxt and self.flights and self._ranks_in_flight() + nxt > self.launcher.max_ranks:
            return False
        trial = self.study.ask(self.space)
        key = layout.key(trial.params)
        if key not in self._keys or key in taken_keys(self.study, exclude=trial.number):
            # Nothing untried was left to propose: close this trial without a run.
            self._tell(trial, Outcome(FailureClass.INVALID, "no untried candidate left"))
            return False
        row = self.candidates.by_key(key)
        self._describe(trial, row)
        if row["refused"]:
            self._tell(trial, Outcome(FailureClass.INVALID, str(row["refused"])))
            return True
        fault = (self.settings.faults or {}).get(trial.number, "")
        cfg = self.candidates.config(key)
        if fault:
            cfg = cfg.model_copy(update={"fault": fault})
        trial.set_user_attr("world", cfg.world)
        trial.set_user_attr("executor", self.launcher.kind)
        try:
            self._start(trial, key, cfg, self.out / "trials" / f"{self.prefix}{trial.number:04d}")
        except LaunchError as exc:
            self._tell(trial, Outcome(FailureClass.LAUNCH, str(exc)))
            return True
        self.progress.started(trial.number, row["label"])
        return True

    def _start(self, trial: optuna.trial.Trial, key: str, cfg: TrainConfig, run_dir: Path) -> None:
        """Write `cfg` into `run_dir`, submit it and watch it as the trial's flight; raises
        LaunchError when the launcher refuses it."""
        run_dir.mkdir(parents=True, exist_ok=True)
        write_json(run_dir / "config.json", cfg.model_dump(mode="json"))
        trial.set_user_attr("run_dir", str(run_dir))
        job = self.launcher.submit(cfg, run_dir)
        trial.set_user_attr("job_id", job.job_id)
        trial.set_user_attr("submitted", job.submitted)
        self.flights[trial.number] = Flight(trial, key, cfg, job, run_dir)

    def _peek_world(self) -> int:
        waiting = self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
        if waiting:
            p = waiting[0].system_attrs.get("fixed_params", {})
            return (
                int(p.get("tp", 1))
                * int(p.get("pp", 1))
                * int(p.get("dp", 1))
                * int(p.get("cp", 1))
            )
        return 0

    def _describe(self, trial: optuna.trial.Trial, row: pd.Series) -> None:
        trial.set_user_attr("key", row["key"])
        trial.set_user_attr("label", row["label"])
        trial.set_user_attr("analytical_rank", int(row["analytical_rank"]))
        for p in PREDICTED:
            trial.set_user_attr(p, float(row[p]))
        for p in ("pred_ttft_ms", "pred_tpot_ms"):  # serving trials
            if p in row:
                trial.set_user_attr(p, float(row[p]))

    def _poll(self) -> None:
        now = time.time()
        for job, deadline in list(self.draining):
            if not job.running():
                self.draining.remove((job, deadline))
            elif now > deadline:
                job.cancel(hard=True)
        for number, flight in list(self.flights.items()):
            job = flight.job
            alive = job.running()
            if alive and job.started is None and not job.pending():
                job.started = now
                flight.trial.set_user_attr("started", now)
            limit_passed = job.started is not None and now - job.started > self.settings.timeout_s
            if alive and flight.timed_out_at is None and limit_passed:
                flight.timed_out_at = now
                job.cancel()
            if alive and flight.timed_out_at is not None:
                if now - flight.timed_out_at > KILL_GRACE_S:
                    job.cancel(hard=True)
                continue
            if alive and not all_ranks_done(flight.run_dir, flight.cfg.world):
                continue
            if alive:  # results are in; the ranks are only tearing down: do not wait for that
                self.draining.append((job, now + KILL_GRACE_S))
            outcome = collect(
                flight.cfg,
                job,
                flight.run_dir,
                flight.timed_out_at is not None,
                self.settings.timeout_s,
            )
            del self.flights[number]
            if self._rerun(flight, outcome):
                continue
            self._tell(flight.trial, outcome)

    def _rerun(self, flight: Flight, outcome: Outcome) -> bool:
        """A trial in which a rank was lost from outside (killed by a signal or the kernel,
        leaving no result, while the ranks that wrote one only lost their peers) runs once
        more before it is called a crash: one lost node or stray signal says nothing about the
        layout. Returns whether the re-run was launched; False when this outcome is final."""
        trial = flight.trial
        if not lost_a_rank(outcome):
            return False
        first = trial.user_attrs.get("rerun_after")
        if first is not None:  # this was the re-run: once is enough
            outcome.reason = f"lost a rank on both runs; first run: {first} | this run: "
            outcome.reason = (outcome.reason + str(outcome.metrics.message))[:1500]
            return False
        world = flight.cfg.world
        spent = self.gpu_hours() + float(outcome.attrs.get("wall_s", 0.0)) * world / 3600
        budget = self.settings.budget_gpu_hours
        if budget is not None and spent >= budget:
            outcome.reason = f"{outcome.reason} | not re-run: --budget-gpu-hours is spent"
            return False
        # The re-run is the layout as the search built it: a fault injected for a test is the
        # first run's accident, not the layout's.
        cfg = self.candidates.config(flight.key)
        run_dir = flight.run_dir.with_name(f"{flight.run_dir.name}-rerun")
        try:
            self._start(trial, flight.key, cfg, run_dir)
        except LaunchError as exc:
            outcome.reason = f"{outcome.reason} | the re-run could not start: {exc}"[:1500]
            return False
        # The lost run's message (the rank that left nothing first), not its log tail.
        trial.set_user_attr("rerun_after", str(outcome.metrics.message)[:500])
        trial.set_user_attr("lost_wall_s", outcome.attrs.get("wall_s", 0.0))
        trial.set_user_attr("started", None)  # a resume must not time the re-run from the first
        label = trial.user_attrs.get("label", flight.key)
        self.progress.started(trial.number, f"{label} (again: a rank was lost)")
        return True

    def _tell(self, trial: optuna.trial.Trial, outcome: Outcome) -> None:
        attrs = dict(outcome.attrs)
        attrs["failure_class"] = outcome.kind.value
        if outcome.kind is FailureClass.OOM:
            outcome.reason += memory_verdict(trial.user_attrs, outcome.metrics)
        if outcome.reason:
            attrs["reason"] = outcome.reason
        for name, value in attrs.items():
            if value is not None:
                trial.set_user_attr(name, value)
        if outcome.kind is FailureClass.OK:
            self.study.tell(trial, outcome.attrs["measured_tokens_per_s_per_gpu"])
        elif outcome.kind is FailureClass.INVALID:
            self.study.tell(trial, state=TrialState.PRUNED)
        else:
            self.study.tell(trial, state=TrialState.FAIL)
        self.progress.finished(trial.number, trial.user_attrs.get("label", ""), outcome)

    # -- interruption and resume --------------------------------------------------------------
    def abandon(self) -> None:
        """Ctrl-C: local jobs die with the search (their trials are re-queued on --resume);
        SLURM jobs go on and --resume waits for them."""
        for flight in self.flights.values():
            if flight.job.kind == "local":
                flight.job.cancel(hard=True)

    def recover(self) -> None:
        """Trials left running by a search that died: wait for live jobs, collect the ones
        that finished meanwhile, mark the rest interrupted; then queue every interrupted layout
        that is not measured, running or queued already, so each is re-run exactly once."""
        running = self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        for frozen in running:
            trial = self._reopen(frozen.number)
            attrs = frozen.user_attrs
            key = attrs.get("key")
            if key not in self._keys:  # killed before its layout was recorded
                self._tell(trial, Outcome(FailureClass.INTERRUPTED, STOPPED))
                continue
            job = self.launcher.reattach(attrs)
            cfg = self.candidates.config(key)
            if job is not None:
                self.flights[frozen.number] = Flight(trial, key, cfg, job, Path(attrs["run_dir"]))
                self.progress.started(frozen.number, attrs.get("label", key) + " (still running)")
                continue
            run_dir = Path(attrs.get("run_dir", ""))
            if "run_dir" in attrs and finished_on_disk(run_dir, cfg.world):
                stub = Job(
                    str(attrs.get("executor")),
                    str(attrs.get("job_id", "")),
                    run_dir / "submitit",
                    float(attrs.get("submitted", time.time())),
                )
                outcome = collect(cfg, stub, run_dir, False, self.settings.timeout_s)
                if not (outcome.kind is FailureClass.CRASH and only_collateral(outcome)):
                    self._tell(trial, outcome)
                    continue
                # Every rank died of its peers' deaths: the search's own stop, not the layout.
            self._tell(trial, Outcome(FailureClass.INTERRUPTED, STOPPED))
        self.requeue_interrupted()

    def _reopen(self, number: int) -> optuna.trial.Trial:
        """A live handle on trial `number` of the study (one a killed search left running), to
        record into and tell; found through the storage's public lookups (a trial's id is the
        storage's, its number the study's: they differ once a storage holds two studies)."""
        study_id = self.storage.get_study_id_from_name(self.study.study_name)
        trial_id = self.storage.get_trial_id_from_study_id_trial_number(study_id, number)
        return optuna.trial.Trial(self.study, trial_id)

    def requeue_interrupted(self) -> None:
        """Queue each interrupted layout once, oldest first, unless something holds it."""
        runnable = set(self.candidates.runnable()["key"])
        for t in self.study.get_trials(deepcopy=False):
            if t.user_attrs.get("failure_class") != FailureClass.INTERRUPTED.value:
                continue
            params = chosen_layout(t)
            if params is None:
                continue
            key = layout.key(params)
            if key in runnable and key not in taken_keys(self.study):
                self.study.enqueue_trial(
                    layout.plain(params), user_attrs={"source": "re-queued", "requeue_of": t.number}
                )

    def record_refused_top(self, limit: int = 5) -> None:
        """Layouts predicted better than the best runnable one that the trainer cannot run:
        recorded as pruned (invalid) trials, so the report says why they were not measured."""
        table = self.candidates.table.sort_values("analytical_rank")
        table = table[~table["key"].isin(taken_keys(self.study))]  # recorded by a run that died
        for _, row in table.iterrows():
            if not row["refused"]:
                break
            if limit <= 0:
                break
            limit -= 1
            attrs = {
                "key": row["key"],
                "label": row["label"],
                "analytical_rank": int(row["analytical_rank"]),
                "failure_class": FailureClass.INVALID.value,
                "reason": row["refused"],
                **{p: float(row[p]) for p in PREDICTED},
            }
            self.study.add_trial(
                create_trial(
                    state=TrialState.PRUNED,
                    params=layout.plain(row),
                    distributions=self.space,
                    user_attrs=attrs,
                )
            )
            refused = Outcome(FailureClass.INVALID, row["refused"])
            self.progress.finished(-1, row["label"], refused)


def _counted(kind: object) -> bool:
    """Whether a trial's recorded class used a run (counts toward --trials)."""
    return kind in FailureClass.values() and FailureClass(kind).counted


def check_settings(s: Settings) -> Settings:
    """The loop's settings, each checked (one line naming the flag)."""
    s.trials = checks.integer(s.trials, "trials", 1, MAX_TRIALS)
    s.parallel = checks.integer(s.parallel, "parallel", 1, MAX_TRIALS)
    s.timeout_s = 60 * checks.number(s.timeout_s / 60, "trial-timeout-min", 0, MAX_MINUTES)
    if s.budget_gpu_hours is not None:
        s.budget_gpu_hours = checks.number(s.budget_gpu_hours, "budget-gpu-hours")
    return s
