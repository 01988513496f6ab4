"""The ray executor of measured trials: a measured search on a Ray cluster the test starts
(`ray start --head`, 2 CPUs): measured trials recorded, ranks as separate processes of one
placement group, a failing trial failed without losing the others, a search killed while a
trial runs resumed onto that trial (timed out and killed there); and the one-line refusals
(ray missing, a cluster that does not answer)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import optuna
import pandas as pd
import pytest
from helpers import run_cli
from optuna.trial import TrialState

from autoconfig.trainer.metrics import read_metrics

CLI = [sys.executable, "-m", "autoconfig.cli", "search", "--model", "tiny-llama"]
# The shapes and flags of tests/test_measure.py's local search: two gloo ranks, 3 steps.
CPU = ["--measure", "--device", "cpu", "--steps", "3", "--warmup", "1", "--gpus", "2"]
RAY = ["--executor", "ray"]
# Ray 2.5x turns token authentication on: a test cluster on this machine goes without, so the
# search (another process) needs no token file.
NO_AUTH = {"RAY_AUTH_MODE": "disabled"}
CLUSTER = pytest.mark.xdist_group("ray-cluster")  # one cluster, on one worker


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[str]:
    """A one-node Ray cluster with 2 CPUs, in a process group of its own that teardown ends
    (its processes only, by group id)."""
    port = free_port()
    log_path = tmp_path_factory.mktemp("ray") / "head.log"
    log = log_path.open("w")
    head = subprocess.Popen(
        [
            sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block",
            f"--port={port}", "--num-cpus=2", "--include-dashboard=false",
            "--disable-usage-stats",
        ],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, **NO_AUTH},
    )  # fmt: skip
    try:
        deadline = time.time() + 120
        while "Ray runtime started" not in log_path.read_text():
            assert head.poll() is None, log_path.read_text()[-2000:]
            assert time.time() < deadline, "the Ray head did not start"
            time.sleep(0.5)
        yield f"127.0.0.1:{port}"
    finally:
        # The head first (it stops what it started), then whatever of its group is left.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(head.pid, signal.SIGTERM)
        # a blocking `ray start` ends its workers on SIGTERM within seconds; what lingers past
        # that is killed with the group
        with contextlib.suppress(subprocess.TimeoutExpired):
            head.wait(timeout=5)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(head.pid, signal.SIGKILL)
        head.wait()
        log.close()


def search(out: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *CPU, *RAY, "--out", str(out), *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **NO_AUTH, **(env or {})},
    )


def study_of(out: Path) -> optuna.Study:
    return optuna.load_study(study_name="autoconfig", storage=f"sqlite:///{out / 'study.db'}")


def placements(run_dir: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(run_dir.glob("placement*.json"))]


def gone(pid: int) -> bool:
    """Whether process `pid` has ended (a zombie left for its parent to reap counts)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True
    return "State:\tZ" in status


def cluster_state(address: str) -> dict:
    """The cluster's free CPUs, named actors and live placement groups of the search's
    namespace, read by a driver of its own."""
    code = (
        "import json, ray\n"
        f"ray.init(address={address!r}, namespace='autoconfig', log_to_driver=False)\n"
        "from ray.util.placement_group import placement_group_table\n"
        "groups = [g for g in placement_group_table().values() if g['state'] != 'REMOVED']\n"
        "print(json.dumps({'cpus': ray.available_resources().get('CPU', 0),\n"
        "  'actors': ray.util.list_named_actors(), 'groups': len(groups)}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **NO_AUTH},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def settled(address: str, timeout_s: float = 20) -> dict:
    """The cluster's state once every trial's resources are back (or the last one seen)."""
    deadline = time.time() + timeout_s
    while True:
        state = cluster_state(address)
        if (state["cpus"] == 2 and not state["groups"]) or time.time() > deadline:
            return state
        time.sleep(1)


@pytest.mark.slow
@CLUSTER
def test_ray_search_measures_trials_in_placement_groups_and_keeps_a_failed_one(
    cluster, tmp_path
) -> None:
    out = tmp_path / "ray"
    # Through RAY_ADDRESS (the default address 'auto'); trial 0's rank 1 fails on its own.
    env = {"RAY_ADDRESS": cluster, "AUTOCONFIG_MEASURE_FAULTS": "0:crash@1"}
    done = search(out, "--trials", "2", env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "(ray, cpu)" in done.stderr
    trials = pd.read_csv(out / "trials.csv", keep_default_na=False).set_index("trial")
    assert trials["class"].to_dict() == {0: "crash", 1: "ok"}
    assert trials.loc[0, "reason"].startswith("rank 1: RuntimeError: crash injected")
    assert trials.loc[0, "rerun_after"] == ""  # a failure of its own: not re-run
    # The ok trial's measurement is in the study and in its metrics.json.
    study = {t.number: t for t in study_of(out).get_trials()}
    assert study[0].state == TrialState.FAIL and study[1].state == TrialState.COMPLETE
    ok = study[1]
    assert ok.value == pytest.approx(float(trials.loc[1, "measured_tokens_per_s_per_gpu"]))
    assert ok.value > 0 and ok.user_attrs["measured_step_time_s"] > 0
    assert ok.user_attrs["executor"] == "ray"
    assert ok.user_attrs["job_id"].startswith("autoconfig-0001-")
    run_dir = Path(ok.user_attrs["run_dir"])
    metrics = read_metrics(run_dir / "metrics.json")
    assert metrics.status == "ok" and len(metrics.losses) == 3  # one per step
    assert all(math.isfinite(loss) and loss > 0 for loss in metrics.losses)
    assert metrics.median_step_time_s == pytest.approx(ok.user_attrs["measured_step_time_s"])
    # Each rank was a process of its own, neither the search nor the test, in one placement
    # group; the ranks' logs are where crash reports read them.
    for number in (0, 1):
        placed = placements(Path(study[number].user_attrs["run_dir"]))
        assert [p["rank"] for p in placed] == [0, 1]
        pids = {p["pid"] for p in placed}
        assert len(pids) == 2 and os.getpid() not in pids
        groups = {p["placement_group"] for p in placed}
        assert len(groups) == 1 and None not in groups
    assert list((run_dir / "submitit").glob(f"{ok.user_attrs['job_id']}_1_log.err"))
    # Nothing of either trial holds the cluster: actors gone, placement groups released.
    state = settled(cluster)
    assert state == {"cpus": 2, "actors": [], "groups": 0}


@pytest.mark.slow
@CLUSTER
def test_a_killed_search_resumes_onto_its_running_ray_trial_and_times_it_out(
    cluster, tmp_path
) -> None:
    out = tmp_path / "resume"
    limit_s = 20
    args = ["--trials", "1", "--ray-address", cluster, "--trial-timeout-min", str(limit_s / 60)]
    log = (tmp_path / "search.log").open("w")
    proc = subprocess.Popen(
        [*CLI, *CPU, *RAY, "--out", str(out), *args],
        stdout=log,
        stderr=log,
        env={**os.environ, **NO_AUTH, "AUTOCONFIG_MEASURE_FAULTS": "0:sleep@1"},
    )
    # Kill the search (SIGKILL) once trial 0's ranks are placed; they run on, detached.
    deadline = time.time() + 180
    run_dir = out / "trials" / "0000"
    while len(placements(run_dir)) < 2:
        assert proc.poll() is None, (tmp_path / "search.log").read_text()[-3000:]
        assert time.time() < deadline, "trial 0's ranks were never placed"
        time.sleep(0.3)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    pids = [p["pid"] for p in placements(run_dir)]
    assert not any(gone(pid) for pid in pids)  # the ranks outlived the search
    done = search(out, *args, "--resume")
    assert done.returncode == 1, done.stderr[-3000:]  # no trial succeeded: it hung
    assert "(still running)" in done.stderr
    trials = pd.read_csv(out / "trials.csv", keep_default_na=False)
    # The resumed search found the trial's actors by name, timed it from when it started and
    # killed it: not interrupted, not run again.
    assert trials["class"].tolist() == ["timeout"]
    assert f"killed at the {limit_s} s trial limit" in trials.loc[0, "reason"]
    assert trials.loc[0, "run_dir"].endswith("0000")
    deadline = time.time() + 20
    while not all(gone(pid) for pid in pids) and time.time() < deadline:
        time.sleep(0.5)
    assert all(gone(pid) for pid in pids), "a hung rank survived its trial's time limit"
    assert settled(cluster) == {"cpus": 2, "actors": [], "groups": 0}


def test_the_ray_executor_without_ray_is_one_line(tmp_path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails, as when not installed
    out = tmp_path / "no-ray"
    done = run_cli(*CLI[3:], *CPU, *RAY, "--out", str(out))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        "error: executor: ray is not installed; pip install 'autoconfig[ray]'"
    )
    assert "Traceback" not in done.stderr
    assert not (out / "study.db").exists()


@pytest.mark.parametrize(
    ("address", "said"),
    [
        ("127.0.0.1:CLOSED", "error: ray-address: no Ray cluster answers at 127.0.0.1:"),
        ("no-port-here", "error: ray-address: expected host:port"),
    ],
)
def test_a_ray_address_that_does_not_answer_is_one_line(tmp_path, address, said) -> None:
    pytest.importorskip("ray")  # the refusal above ray's own connection needs ray installed
    # A port just freed: nothing listens there (chosen here, not at collection, which every
    # xdist worker does and must agree on).
    address = address.replace("CLOSED", str(free_port()))
    out = tmp_path / "unreachable"
    started = time.time()
    done = run_cli(*CLI[3:], *CPU, *RAY, "--ray-address", address, "--out", str(out))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith(said)
    assert "Traceback" not in done.stderr
    assert not (out / "study.db").exists()  # refused before the study was made
    assert time.time() - started < 60  # not ray.init's minutes of retries


def test_a_ray_address_without_the_ray_executor_is_refused(tmp_path) -> None:
    done = run_cli(*CLI[3:], *CPU, "--ray-address", "127.0.0.1:6379", "--out", str(tmp_path))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == "error: ray-address: only with --executor ray"
