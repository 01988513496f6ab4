"""Measured search end to end on this machine's CPU: real trainer runs through submitit's local
executor and through SLURM (sbatch -> srun, 2 gloo ranks), injected failures of every class,
and a SLURM search killed with SIGKILL while its job runs, then resumed (a local search under
random kills is tests/test_resume_kill.py)."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

import optuna
import pandas as pd
import pytest
from helpers import run_cli
from optuna.trial import TrialState

from autoconfig.trainer.metrics import read_metrics

CLI = [sys.executable, "-m", "autoconfig.cli", "search", "--model", "tiny-llama"]
CPU = ["--measure", "--device", "cpu", "--steps", "3", "--warmup", "1"]


def search(out: Path, *args: str, env: dict | None = None, timeout: int = 600):
    """A measured search in a process of its own (its ranks, faults and study as a user's)."""
    return subprocess.run(
        [*CLI, *CPU, "--out", str(out), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def refused_search(out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """A measured search that must be refused before anything runs: in this process (the
    entry point's own function), without a fresh interpreter's seconds of imports."""
    return run_cli(*CLI[3:], *CPU, "--out", str(out), *args)


def study_of(out: Path) -> optuna.Study:
    return optuna.load_study(study_name="autoconfig", storage=f"sqlite:///{out / 'study.db'}")


def peek(out: Path) -> tuple[int, list[int]]:
    """(finished trials, numbers of running trials with a job) read through a read-only SQLite
    connection: polling must not write to the study the search is writing."""
    db = out / "study.db"
    if not db.exists():
        return 0, []
    try:
        with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1)) as con:
            done = con.execute("select count(*) from trials where state = 'COMPLETE'").fetchone()
            live = con.execute(
                "select t.number from trials t join trial_user_attributes a "
                "on a.trial_id = t.trial_id where t.state = 'RUNNING' and a.key = 'job_id'"
            ).fetchall()
    except sqlite3.Error:  # not created yet, or busy
        return 0, []
    return int(done[0]), [int(n) for (n,) in live]


# The tests that read the one local measured search stay on one xdist worker, which runs it once.
LOCAL_SEARCH = pytest.mark.xdist_group("measured-local-search")


@pytest.fixture(scope="module")
def local_search(tmp_path_factory):
    out = tmp_path_factory.mktemp("measured") / "run"
    done = search(out, "--gpus", "4", "--trials", "4")
    return out, done


@LOCAL_SEARCH
def test_local_measured_search_ranks_measured_trials(local_search) -> None:
    out, done = local_search
    assert done.returncode == 0, done.stderr[-3000:]
    trials = pd.read_csv(out / "trials.csv")
    assert (trials["class"] == "ok").sum() == 4
    assert trials["key"].is_unique
    assert (trials["measured_tokens_per_s_per_gpu"] > 0).all()
    # The analytical top 3 were measured first, in predicted order.
    first = trials.sort_values("trial").head(3)
    assert first["analytical_rank"].tolist() == sorted(first["analytical_rank"])
    assert (first["source"] == "analytical top-k").all()
    ranked = pd.read_csv(out / "measured.csv")
    measured = ranked[ranked["ranked_by"] == "measured"]
    assert len(measured) == 4
    assert measured["measured_tokens_per_s_per_gpu"].is_monotonic_decreasing
    assert "Measured trials" in (out / "report.html").read_text()
    assert "measured search: measured where measured" in done.stdout
    # Each trial's metrics.json holds the trainer's measurement and the run folder; trials.csv
    # sets the model's figures for the run as launched (fp32 CPU ranks) beside the search's.
    for _, trial in trials.iterrows():
        metrics = read_metrics(Path(trial["run_dir"]) / "metrics.json")
        own = metrics.predicted["pred_peak_mem_gib"]
        assert trial["run_pred_peak_mem_gib"] == pytest.approx(own)
        assert trial["run_pred_peak_mem_gib"] > trial["pred_peak_mem_gib"]  # fp32 against bf16
    # The search's own work around each trial (launch, polling, collection) stays small.
    assert trials["overhead_s"].median() < 10


@LOCAL_SEARCH
def test_resume_of_another_search_is_refused_and_leaves_the_study(local_search) -> None:
    out, _ = local_search
    before = len(study_of(out).get_trials())
    done = refused_search(out, "--gpus", "4", "--trials", "4", "--resume", "--seq-len", "64")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith("error: resume:")
    assert "seq_len 128 (now 64)" in done.stderr
    again = refused_search(out, "--gpus", "4", "--trials", "4")  # no --resume on a used folder
    assert again.returncode == 2 and "add --resume" in again.stderr
    assert len(study_of(out).get_trials()) == before


# The trial limit of the failure test, which trial 2 sleeps into: its two-rank ok trials took
# 5-8 s on two busy cores; 20 s keeps them well inside it and the test 10 s shorter than the
# 30 s it had.
TIMEOUT_S = 20


def test_every_failure_class_is_recorded_and_the_study_completes(tmp_path) -> None:
    out = tmp_path / "faults"
    faults = {"AUTOCONFIG_MEASURE_FAULTS": "1:alloc@0,2:sleep@1,3:crash@1,4:abort@1"}
    started = time.time()
    done = search(
        out, "--gpus", "2", "--trials", "5", "--trial-memory-gib", "2",
        "--trial-timeout-min", str(TIMEOUT_S / 60), env=faults,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    trials = pd.read_csv(out / "trials.csv", keep_default_na=False).set_index("trial")
    assert trials["class"].to_dict() == {0: "ok", 1: "oom", 2: "timeout", 3: "crash", 4: "ok"}
    # A rank killed from outside (trial 4's first run) costs a re-run, not the layout: the
    # re-run measured it, and the first run's lost rank is on record.
    assert "ranks 1 wrote no result" in trials.loc[4, "rerun_after"]
    assert trials.loc[4, "run_dir"].endswith("0004-rerun")
    assert (trials.drop(index=4)["rerun_after"] == "").all()  # a failure of its own: no re-run
    assert "can't allocate memory" in trials.loc[1, "reason"]
    assert "memory verdict was wrong" in trials.loc[1, "reason"]
    assert f"killed at the {TIMEOUT_S} s trial limit" in trials.loc[2, "reason"]
    assert trials.loc[2, "wall_s"] < TIMEOUT_S + 20  # killed, not hung
    assert (trials.loc[[0, 4], "wall_s"] < TIMEOUT_S).all()  # the limit cut none but trial 2
    assert trials.loc[3, "reason"].startswith("rank 1: RuntimeError: crash injected")
    states = {t.number: t.state for t in study_of(out).get_trials()}
    assert states[0] == TrialState.COMPLETE
    assert {states[1], states[2], states[3]} == {TrialState.FAIL}
    assert time.time() - started < 400
    # The folder's ranks are gone: nothing left running after the search.
    left = subprocess.run(["pgrep", "-f", str(out)], capture_output=True, text=True)
    assert left.stdout.strip() == ""


def test_a_layout_that_loses_a_rank_on_both_runs_is_a_crash_that_says_so(tmp_path) -> None:
    out = tmp_path / "lost"
    done = search(out, "--gpus", "2", "--trials", "1", env={"AUTOCONFIG_TRAINER_FAULT": "abort@1"})
    assert done.returncode == 1, done.stderr[-3000:]  # no trial succeeded
    trials = pd.read_csv(out / "trials.csv", keep_default_na=False)
    assert trials["class"].tolist() == ["crash"]
    reason = trials.loc[0, "reason"]
    # What happened comes first, so that no cut of a long message loses it.
    assert reason.startswith("lost a rank on both runs; first run: ranks 1 wrote no result")
    assert "| this run: ranks 1 wrote no result" in reason
    assert trials.loc[0, "rerun_after"].startswith("ranks 1 wrote no result")
    first, again = out / "trials" / "0000", out / "trials" / "0000-rerun"
    assert (first / "rank0.json").exists() and (again / "rank0.json").exists()


def test_slurm_measured_search_end_to_end(tmp_path, slurm) -> None:
    out = tmp_path / "slurm"
    bad = refused_search(
        out, "--gpus", "2", "--executor", "slurm", "--gpus-per-node", "2",
        "--slurm-partition", "no-such-partition",
    )  # fmt: skip
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines()[-1].startswith("error: slurm: the cluster refused")
    assert not (out / "study.db").exists()
    args = ["--gpus", "2", "--executor", "slurm", "--gpus-per-node", "2", "--trials", "4"]
    # Kill the search (SIGKILL) while a SLURM job runs; --resume must wait for that job.
    log = (tmp_path / "search.log").open("w")
    proc = subprocess.Popen([*CLI, *CPU, "--out", str(out), *args], stdout=log, stderr=log)
    running_at_kill = None
    deadline = time.time() + 300
    while time.time() < deadline and running_at_kill is None and proc.poll() is None:
        time.sleep(0.3)
        finished, live = peek(out)
        if finished >= 1 and live:
            running_at_kill = live[0]
    assert running_at_kill is not None, "no SLURM trial was seen running"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    done = search(out, *args, "--resume")
    assert done.returncode == 0, done.stderr[-3000:]
    trials = pd.read_csv(out / "trials.csv")
    assert (trials["class"] == "ok").sum() == 4 and trials["key"].is_unique
    states = {t.number: t for t in study_of(out).get_trials()}
    # The job outlived the search: its result was waited for (or collected), not re-run.
    assert states[running_at_kill].state == TrialState.COMPLETE
    for t in study_of(out).get_trials(states=(TrialState.COMPLETE,)):
        assert t.user_attrs["executor"] == "slurm"
        assert int(t.user_attrs["job_id"]) > 0  # a real SLURM job id
        logs = list((Path(t.user_attrs["run_dir"]) / "submitit").glob("*_1_log.out"))
        assert logs, "srun started a second task"
    ranked = pd.read_csv(out / "measured.csv")
    assert (ranked["ranked_by"] == "measured").sum() == 4
