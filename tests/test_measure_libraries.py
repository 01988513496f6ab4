"""The measured search through its libraries' public APIs: storage URLs read (and their
passwords hidden) by SQLAlchemy's URL parser, submitit jobs polled through `Job`, a trial that a
killed search left running reopened by its number through Optuna's storage lookups, and no
private attribute of another package read anywhere in autoconfig/measure/."""

from __future__ import annotations

import ast
import os
from pathlib import Path
from unittest import mock

import optuna
import pytest
from optuna.trial import TrialState
from submitit.local.local import LocalJob

from autoconfig.base.errors import UserError
from autoconfig.cli.app import execute
from autoconfig.measure import launcher
from autoconfig.measure.runner import Runner, Settings
from autoconfig.measure.sampler import CandidateSampler, chosen_layout, distributions
from autoconfig.measure.study import enqueue_top, hide_secrets, masked, open_storage, open_study
from autoconfig.spec import layout

MEASURE = ["search", "--model", "tiny-llama", "--gpus", "1", "--measure", "--device", "cpu"]
PACKAGE = Path(__file__).resolve().parents[1] / "autoconfig" / "measure"


# -- storage URLs ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url, secrets",
    [
        ("postgresql://fuzz:s3cr3t-pw@127.0.0.1:1/nothing", ["s3cr3t-pw"]),
        # A '/' in a password: SQLAlchemy reads it as part of the password.
        ("postgresql://ann:pa/ss-w0rd@127.0.0.1:1/db", ["pa/ss-w0rd"]),
        ("mysql://u:p%40ssw0rd@nowhere/x", ["p%40ssw0rd", "p@ssw0rd"]),
        ("postgresql://ann@127.0.0.1/db?password=qu3ry-pw&sslmode=off", ["qu3ry-pw"]),
        ("postgresql//ann:typ0-pw@127.0.0.1/db", ["typ0-pw"]),  # not a URL at all
    ],
)
def test_a_storage_password_never_reaches_a_message(url, secrets) -> None:
    shown = masked(url)
    driver_said = f"connection to {url} failed for ann with {secrets[-1]}"
    told = hide_secrets(driver_said, url)
    for secret in secrets:
        assert secret not in shown and secret not in told
    assert "***" in shown and "***" in told
    assert "127.0.0.1" in shown or "nowhere" in shown  # where it went is still said


def test_a_url_without_secrets_is_shown_as_given() -> None:
    for url in ("sqlite:///runs/my study:1/study.db", "sqlite:///:memory:", "runs/x.journal"):
        assert masked(url) == url


def test_a_refused_storage_names_the_host_but_not_the_password(capsys, tmp_path) -> None:
    url = "postgresql://ann:pa/ss-w0rd@127.0.0.1:1/nothing"
    code = execute([*MEASURE, "--storage", url, "--out", str(tmp_path / "s")])
    said = capsys.readouterr()
    assert code == 2
    (line,) = [x for x in said.err.splitlines() if x.startswith("error:")]
    assert "storage: cannot open 'postgresql://ann:***@127.0.0.1:1/nothing'" in line
    assert "pa/ss-w0rd" not in said.err + said.out
    with pytest.raises(UserError, match=r"\*\*\*") as refused:
        open_storage(url)
    assert "pa/ss-w0rd" not in str(refused.value)


# -- submitit ----------------------------------------------------------------------------------


def test_a_local_job_is_polled_through_submitits_public_job_api(tmp_path) -> None:
    # The spec has only LocalJob's public surface: a private attribute read raises.
    handle = mock.create_autospec(LocalJob, instance=True)
    dead_pid = str(2**22 + 1)  # above the kernel's pid limit: no such process
    job = launcher.Job("local", dead_pid, tmp_path, 0.0, handle)
    handle.done.return_value = False
    assert job.running()
    handle.done.return_value = True
    assert not job.running()
    with mock.patch.object(launcher.os, "kill"):
        job.cancel(hard=True)
    assert handle.done.called  # cancel asks the job again, which reaps a local process


def test_a_reattached_local_job_without_a_handle_reads_the_process_table(tmp_path) -> None:
    assert not launcher.Job("local", str(os.getpid()), tmp_path, 0.0).running()  # not submitit


# -- Optuna ------------------------------------------------------------------------------------


class _NoJobs:
    """A launcher whose jobs all died with the search that started them."""

    kind = "local"
    max_ranks = 4

    def reattach(self, attrs: dict) -> None:
        return None


class _Quiet:
    def started(self, number: int, label: str) -> None: ...

    def finished(self, number: int, label: str, outcome: object) -> None: ...

    def refresh(self, runner: object) -> None: ...


@pytest.fixture(scope="module")
def candidates():
    from autoconfig import api
    from autoconfig.measure.candidates import build

    ranked = api.search("tiny-llama", 4, "cpu-gloo", gbs=16)
    return build(ranked, "tiny-llama", 30, {"steps": 3, "warmup": 1, "device": "cpu"})


def test_a_trial_left_running_is_reopened_by_number_closed_and_queued_again(
    candidates, tmp_path
) -> None:
    storage = open_storage(f"sqlite:///{tmp_path / 'study.db'}")
    # Another study's trial first, so this study's trial ids and numbers differ.
    optuna.create_study(study_name="earlier", storage=storage).ask()
    sampler = CandidateSampler(candidates.table, "model", seed=1)
    study = open_study(storage, {"m": "x"}, False, sampler, "study")
    first = enqueue_top(study, candidates, 1)[0]
    left = study.ask(distributions(candidates.table))  # then the search was killed
    left.set_user_attr("key", first)
    assert left.number == 0 and left._trial_id != left.number

    runner = Runner(study, storage, candidates, _NoJobs(), Settings(trials=2), tmp_path, _Quiet())
    runner.recover()

    closed = study.trials[left.number]
    assert closed.state is TrialState.FAIL
    assert closed.user_attrs["failure_class"] == "interrupted"
    earlier = optuna.load_study(study_name="earlier", storage=storage).trials[0]
    assert earlier.state is TrialState.RUNNING  # the other study's trial was left alone
    (again,) = [t for t in study.trials if t.state is TrialState.WAITING]
    assert layout.key(chosen_layout(again)) == first


def test_the_measured_search_reads_no_private_attribute_of_another_package() -> None:
    found = []
    for path in sorted(PACKAGE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            name = None
            if isinstance(node, ast.Attribute) and not (
                isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
            ):
                name = node.attr
            elif isinstance(node, ast.Call) and getattr(node.func, "id", "") in (
                "getattr",
                "hasattr",
            ):
                arg = node.args[1] if len(node.args) > 1 else None
                name = arg.value if isinstance(arg, ast.Constant) else None
            if isinstance(name, str) and name.startswith("_") and not name.startswith("__"):
                found.append(f"{path.name}:{node.lineno} {name}")
    assert found == []
