"""Kill the measured search's whole process tree at random moments, over and over (SIGKILL and
SIGINT, as a crash or a Ctrl-C would), resuming each time: no finished trial is ever lost, no
layout is measured twice, and every interrupted layout is measured exactly once in the end."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pandas as pd
import pytest
from optuna.trial import TrialState

from autoconfig.measure.sampler import chosen_layout
from autoconfig.spec import layout

SEARCH = [
    sys.executable, "-m", "autoconfig.cli", "search", "--model", "tiny-llama", "--gpus", "1",
    "--measure", "--device", "cpu", "--steps", "2", "--warmup", "1", "--trials", "5",
    "--trial-timeout-min", "5",
]  # fmt: skip
COUNTED = ("ok", "oom", "timeout", "crash", "launch")
KILLS = 12


def _study(out: Path) -> optuna.Study | None:
    if not (out / "study.db").exists():
        return None
    storage = optuna.storages.RDBStorage(f"sqlite:///{out / 'study.db'}")
    if not any(s.study_name == "autoconfig" for s in storage.get_all_studies()):
        return None
    return optuna.load_study(study_name="autoconfig", storage=storage)


def _finished(out: Path) -> dict[int, tuple[str, str, float | None]]:
    """number -> (class, layout key, value) of every trial that finished with a run."""
    study = _study(out)
    if study is None:
        return {}
    done = {}
    for t in study.get_trials():
        kind = t.user_attrs.get("failure_class")
        if t.state.is_finished() and kind in COUNTED:
            done[t.number] = (kind, layout.key(t.params), t.value)
    return done


def _start(out: Path, log: Path) -> subprocess.Popen:
    resume = ["--resume"] if _study(out) is not None else []
    with log.open("a") as sink:  # its own session: the test kills the whole tree at once
        return subprocess.Popen(
            [*SEARCH, "--out", str(out), *resume],
            stdout=sink,
            stderr=sink,
            start_new_session=True,
        )


def _kill_tree(proc: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # it may have finished already
        os.killpg(proc.pid, sig)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=60)
    with contextlib.suppress(ProcessLookupError):  # a rank still tearing down goes too
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


@pytest.mark.slow
def test_random_kills_lose_nothing_and_rerun_each_interrupted_layout_once(tmp_path) -> None:
    out, log = tmp_path / "search", tmp_path / "search.log"
    rng = random.Random(18)
    seen: dict[int, tuple[str, str, float | None]] = {}
    signals = []
    for i in range(KILLS):
        proc = _start(out, log)
        time.sleep(rng.uniform(0.5, 9.0))
        sig = signal.SIGKILL if i % 2 == 0 else signal.SIGINT
        signals.append(sig.name)
        _kill_tree(proc, sig)
        now = _finished(out)
        lost = {n: v for n, v in seen.items() if now.get(n) != v}
        assert not lost, f"kill {i} ({sig.name}) lost finished trials {lost}"
        seen = now
    done = subprocess.run([*SEARCH, "--out", str(out), "--resume"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "resuming:" in done.stderr  # the resumed search says what it picks up
    study = _study(out)
    assert study is not None
    trials = study.get_trials()
    finished = _finished(out)
    assert all(seen[n] == finished[n] for n in seen)  # nothing finished was lost, ever
    keys = [key for _, key, _ in finished.values()]
    assert len(keys) == len(set(keys)), "a layout was measured twice"
    assert len(finished) == 5
    interrupted = [t for t in trials if t.user_attrs.get("failure_class") == "interrupted"]
    assert interrupted, "no kill landed while a trial ran: the test proved nothing"
    # A kill between Optuna's per-dimension suggestions leaves a trial with part of a layout:
    # nothing was chosen to run, so there is nothing to re-run (the runner skips it too).
    chosen = [(t, chosen_layout(t)) for t in interrupted if chosen_layout(t) is not None]
    assert chosen, "no kill landed while a chosen layout ran: the test proved nothing"
    for t, params in chosen:
        assert layout.key(params) in keys, f"interrupted trial {t.number} was never re-run"
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    table = pd.read_csv(out / "trials.csv")
    assert table[table["class"].isin(COUNTED)]["key"].is_unique
    print(
        f"{KILLS} kills ({signals.count('SIGKILL')} SIGKILL, {signals.count('SIGINT')} SIGINT): "
        f"{len(interrupted)} interrupted trials, each re-run once; {len(finished)} finished, "
        f"0 lost, 0 measured twice"
    )
