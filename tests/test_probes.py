"""The hostile-user probes of issue 18, one test each: bad input is one line naming the field and
exit code 2 (never a traceback, never a folder or study created), a study where nothing
succeeds is an outcome, the output folder is locked, a report set is switched whole, CSV cells
are safe for spreadsheets and storage passwords are masked. All in-process and fast; the
end-to-end kill loop is tests/test_resume_kill.py, the random probes tests/test_fuzz_*.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import optuna
import pandas as pd
import pytest
from helpers import held_elsewhere

from autoconfig.base import fileio
from autoconfig.base.errors import UserError
from autoconfig.base.folderlock import LOCK_NAME, folder_lock, holder
from autoconfig.cli.app import execute
from autoconfig.spec import layout

HF = {"num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 4, "vocab_size": 1000}
RUNS = "model,layers,hidden,heads,vocab,gpu,num_gpus,tp,pp,gbs,seq_len\n"
MEASURE = ["search", "--model", "tiny-llama", "--gpus", "1", "--measure", "--device", "cpu"]


def refused(capsys, argv: list[str], *needles: str) -> str:
    """Runs the CLI in-process; it must exit 2 with exactly one 'error:' line holding every
    needle, and no traceback. Returns that line."""
    code = execute(argv)
    said = capsys.readouterr()
    assert "Traceback" not in said.err + said.out
    assert code == 2, (argv, code, said.err[-1000:])
    errors = [line for line in said.err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, said.err
    for needle in needles:
        assert needle in errors[0], (needle, errors[0])
    return errors[0]


@pytest.fixture
def probe_files(tmp_path) -> dict[str, Path]:
    made = {
        "lots.json": json.dumps(HF | {"max_position_embeddings": "lots"}),
        "big.json": json.dumps(HF)[:-1] + ', "max_position_embeddings": 1e400}',
        "bool.json": json.dumps(HF | {"num_hidden_layers": True}),
        "formula.csv": RUNS + "\"=cmd|' /C calc'!A0\",2,256,4,1000,h100-sxm-80gb,8,1,1,8,128\n",
        "huge_seq.csv": RUNS + "llama3-8b,,,,,h100-sxm-80gb,8,1,1,64,1e23\n",
        "a_file": "not a folder\n",
    }
    paths = {}
    for name, text in made.items():
        paths[name] = tmp_path / name
        paths[name].write_text(text)
    paths["binary"] = tmp_path / "binary.bin"
    paths["binary"].write_bytes(bytes(range(256)))
    paths["folder"] = tmp_path / "folder"
    paths["folder"].mkdir()
    return paths


# -- options checked before a study is created or touched ----------------------------------


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--steps", "0"], "steps:"),
        (["--steps", "3", "--warmup", "3"], "warmup:"),
        (["--steps", "3", "--warmup", "5"], "warmup:"),
        (["--trial-memory-gib", "nan"], "trial-memory-gib:"),
        (["--trial-timeout-min", "nan"], "trial-timeout-min:"),
        (["--trial-timeout-min", "-1"], "trial-timeout-min:"),
    ],
)
def test_measure_options_are_checked_before_the_folder_is_touched(
    capsys, tmp_path, flags, needle
) -> None:
    out = tmp_path / "study"
    refused(capsys, [*MEASURE, "--out", str(out), *flags], needle)
    assert not out.exists()


def test_refused_resume_of_a_new_folder_creates_nothing(capsys, tmp_path) -> None:
    out = tmp_path / "new"
    refused(capsys, [*MEASURE, "--resume", "--out", str(out)], "resume:", "no measured search")
    assert not out.exists()  # no study.db, no lock file, no folder


# -- numbers and paths -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["estimate", "--model", "llama3-8b", "--gpus", "8", "--seq-len", "-5"], "seq-len:"),
        (["estimate", "--model", "llama3-8b", "--gpus", "8", "--seq-len", "-5", "--gbs", "64"],
         "seq-len:"),
        (["estimate", "--model", "llama3-8b", "--gpus", "8", "--seq-len", "0"], "seq-len:"),
        (["search", "--model", "llama3-8b", "--gpus", str(2**53 + 1)], "gpus:"),
        (["search", "--model", "llama3-8b", "--gpus", "8", "--max-memory-gib", "nan"],
         "max-memory-gib:"),
        (["search", "--model", "llama3-8b", "--gpus", "8", "--tokens", "nan"], "tokens:"),
        (["search", "--model", "llama3-8b", "--gpus", "8", "--gpu-hour-usd", "nan"],
         "gpu-hour-usd:"),
        (["search", "--model", "llama3-8b", "--gpus", "8", "--gpu-hour-usd", "inf"],
         "gpu-hour-usd:"),
    ],
)  # fmt: skip
def test_numbers_out_of_range_are_one_line(capsys, argv, needle) -> None:
    refused(capsys, argv, needle)


def test_a_trillion_gpus_is_refused_at_once_and_2_to_the_24_takes_seconds(capsys) -> None:
    started = time.perf_counter()
    infer = ["infer", "--model", "llama3-8b", "--input-len", "128", "--output-len", "128"]
    refused(capsys, [*infer, "--gpus", "1000000000000"], "gpus:")
    # The largest count accepted: the search walks the divisors of the GPU count (25 here),
    # not every count up to it.
    assert execute([*infer, "--gpus", str(2**24), "--top", "1"]) == 0
    capsys.readouterr()
    assert time.perf_counter() - started < 60


@pytest.mark.parametrize(
    ("flag", "target", "needle"),
    [
        ("--out", "a_file", "is a file, not a folder"),
        ("--out", "/proc/autoconfig", "cannot write under /proc"),
        ("--space", "folder", "is a folder"),
        ("--space", "binary", "is a binary file"),
        ("--profile", "binary", "is a binary file"),
        ("--profile", "folder", "is a folder"),
        ("--model", "lots.json", "max_position_embeddings: must be an integer"),
        ("--model", "big.json", "max_position_embeddings: must be an integer"),
        ("--model", "bool.json", "num_hidden_layers: must be an integer"),
        ("--model", "folder", "is a folder without a config.json"),
        ("--model", "binary", "model:"),
    ],
)
def test_paths_that_are_not_what_the_flag_reads_are_one_line(
    capsys, probe_files, flag, target, needle
) -> None:
    value = str(probe_files.get(target, target))
    argv = ["search", "--model", "llama3-8b", "--gpus", "8"]
    if flag == "--model":
        argv = ["search", "--gpus", "8"]
    refused(capsys, [*argv, flag, value], flag.lstrip("-") + ":", needle)


def test_estimate_out_at_a_folder_is_refused_and_leaves_no_temporary(capsys, probe_files) -> None:
    folder = probe_files["folder"]
    argv = ["estimate", "--runs", str(probe_files["formula.csv"]), "--out", str(folder)]
    refused(capsys, argv, "out:", "is a folder")
    assert list(folder.iterdir()) == []


def test_calibrate_write_under_proc_is_one_line(capsys, probe_files) -> None:
    argv = ["calibrate", str(probe_files["folder"]), "--write", "/proc/autoconfig/x.yaml"]
    refused(capsys, argv, "write:", "/proc")


def test_a_row_with_an_impossible_sequence_length_says_so(capsys, probe_files, tmp_path) -> None:
    out = tmp_path / "pred.csv"
    assert execute(["estimate", "--runs", str(probe_files["huge_seq.csv"]), "--out", str(out)]) == 0
    capsys.readouterr()
    row = pd.read_csv(out, dtype=str, keep_default_na=False).iloc[0]
    # read as --fix reads an integer (checks.integer): the field and the range allowed
    assert row["error"].startswith("seq_len: must be an integer in 1..16,777,216")
    assert row["pred_step_time_s"] == ""  # blank, and the reason says why


def test_csv_cells_a_spreadsheet_would_run_are_written_as_text(capsys, probe_files, tmp_path):
    out = tmp_path / "pred.csv"
    assert execute(["estimate", "--runs", str(probe_files["formula.csv"]), "--out", str(out)]) == 0
    capsys.readouterr()
    row = pd.read_csv(out, dtype=str, keep_default_na=False).iloc[0]
    assert row["model"] == "'=cmd|' /C calc'!A0"
    assert fileio.safe_cell("-1.5") == "-1.5" and fileio.safe_cell("+3") == "+3"
    assert fileio.safe_cell("@SUM(A1)") == "'@SUM(A1)"
    assert fileio.safe_cell("-2+3") == "'-2+3"


def test_a_fixed_value_no_layout_has_is_explained(capsys) -> None:
    code = execute(["search", "--model", "llama3-8b", "--gpus", "8", "--fix", "tp=3"])
    said = capsys.readouterr()
    assert code == 1
    assert "tp=3 is not among the space's tp values (1, 2, 4, 8)" in said.out + said.err


def test_storage_passwords_are_never_echoed(capsys, tmp_path) -> None:
    url = "postgresql://fuzz:s3cr3t-pw@127.0.0.1:1/nothing"
    line = refused(capsys, [*MEASURE, "--storage", url, "--out", str(tmp_path / "s")], "storage:")
    assert "s3cr3t-pw" not in line and "***" in line


# -- the output folder's lock --------------------------------------------------------------


def test_a_second_search_on_a_held_folder_is_one_line(capsys, tmp_path) -> None:
    out = tmp_path / "busy"
    with held_elsewhere(out) as other:
        line = refused(capsys, [*MEASURE, "--out", str(out)], "out:", "in use by another")
        assert f"pid {other.pid}" in line
        assert not (out / "study.db").exists()


def test_a_stale_lock_is_taken_over_with_a_note(capsys, tmp_path) -> None:
    out = tmp_path / "stale"
    out.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a pid that no longer runs
    (out / LOCK_NAME).write_text(json.dumps({"pid": dead.pid, "host": os.uname().nodename}))
    with folder_lock(out):
        assert holder(out)["pid"] == os.getpid()
    assert "no longer running; taking the lock over" in capsys.readouterr().err
    assert not (out / LOCK_NAME).exists()  # released


def test_a_lock_never_leaves_a_folder_it_created(tmp_path) -> None:
    out = tmp_path / "made"
    with pytest.raises(UserError), folder_lock(out):
        raise UserError("refused inside")
    assert not out.exists()


# -- report sets switched whole ------------------------------------------------------------


def test_a_report_set_killed_midway_leaves_the_old_set(tmp_path, monkeypatch) -> None:
    folder = tmp_path / "report"
    old = {"best.json": '{"gbs": 1024}', "report.html": "gbs 1024", "trials.csv": "a\n1\n"}
    fileio.write_set(folder, old)
    real_link, calls = fileio._link, []

    def killed_at_the_switch(path: Path, target: str) -> bool:
        calls.append(path.name)
        if path.name == fileio.CURRENT:
            raise KeyboardInterrupt  # as a kill would, just before the one rename
        return real_link(path, target)

    monkeypatch.setattr(fileio, "_link", killed_at_the_switch)
    new = {"best.json": '{"gbs": 4096}', "report.html": "gbs 4096", "measured.csv": "b\n"}
    with pytest.raises(KeyboardInterrupt):
        fileio.write_set(folder, new)
    assert fileio.CURRENT in calls
    assert {n: (folder / n).read_text() for n in old} == old  # the old set, whole
    assert not (folder / "measured.csv").exists()
    monkeypatch.setattr(fileio, "_link", real_link)
    fileio.write_set(folder, new)
    assert {n: (folder / n).read_text() for n in new} == new  # then the new one, whole
    assert not (folder / "trials.csv").exists()
    sets = [p for p in (folder / fileio.SETS).iterdir() if p.name.startswith("set-")]
    assert len(sets) == 1


# -- resume and the study with no success --------------------------------------------------


@pytest.fixture(scope="module")
def candidates():
    from autoconfig import api
    from autoconfig.measure.candidates import build

    ranked = api.search("tiny-llama", 4, "cpu-gloo", gbs=16)
    return build(ranked, "tiny-llama", 30, {"steps": 3, "warmup": 1, "device": "cpu"})


def test_an_interrupted_layout_is_proposed_again_exactly_once(candidates) -> None:
    from autoconfig.measure.sampler import CandidateSampler, distributions, taken_keys
    from autoconfig.measure.study import enqueue_top, open_storage, open_study

    sampler = CandidateSampler(candidates.table, "model", seed=1)
    study = open_study(open_storage("sqlite:///:memory:"), {"m": "x"}, False, sampler, "memory")
    first = enqueue_top(study, candidates, 1)[0]
    space = distributions(candidates.table)
    trial = study.ask(space)
    assert layout.key(trial.params) == first
    trial.set_user_attr("key", first)
    trial.set_user_attr("failure_class", "interrupted")
    study.tell(trial, state=optuna.trial.TrialState.FAIL)
    assert first not in taken_keys(study)  # an interrupted trial gives its layout back
    study.enqueue_trial(layout.plain(trial.params), user_attrs={"source": "re-queued"})
    again = study.ask(space)
    assert layout.key(again.params) == first  # measured again ...
    again.set_user_attr("failure_class", "ok")
    study.tell(again, 1.0)
    assert first in taken_keys(study)
    for _ in range(5):  # ... and never a third time
        nxt = study.ask(space)
        assert layout.key(nxt.params) != first
        nxt.set_user_attr("failure_class", "ok")
        study.tell(nxt, 1.0)


def test_a_study_where_nothing_succeeded_ranks_and_says_why(candidates) -> None:
    from autoconfig.measure import summary
    from autoconfig.measure.result import MeasuredSearch

    rows = candidates.runnable().head(3)
    trials = pd.DataFrame(
        {
            "trial": [0, 1, 2],
            "key": rows["key"].tolist(),
            "layout": rows["label"].tolist(),
            "analytical_rank": rows["analytical_rank"].tolist(),
            "class": ["crash", "oom", "timeout"],
            "reason": ["rank 0: RuntimeError: boom", "out of memory", "killed at the limit"],
            "measured_tokens_per_s_per_gpu": [None, None, None],
        }
    )
    ranked = summary.ranking(candidates, trials)  # raised TypeError when nothing succeeded
    assert len(ranked) == len(candidates.table)
    assert set(ranked.head(len(ranked) - 3)["ranked_by"]) == {"predicted"}
    search = MeasuredSearch(trials, ranked)
    assert not search.any_ok
    lines = search.diagnosis()
    assert lines[0] == "no trial succeeded: 1 oom, 1 timeout, 1 crash"
    assert "  crash (1): rank 0: RuntimeError: boom; read the reason" in "\n".join(lines)
    assert any(line.strip().startswith("closest to working:") for line in lines)
    closest = search.closest()
    assert closest is not None and closest["class"] == "timeout"  # it ran, only too long
    assert "diagnosis" in search.summary()


@pytest.mark.slow
def test_a_measured_search_where_every_trial_crashes_reports_and_can_be_rerun(
    capsys, tmp_path, monkeypatch
) -> None:
    out = tmp_path / "all-crash"
    args = [*MEASURE, "--steps", "2", "--warmup", "1", "--out", str(out)]
    monkeypatch.setenv("AUTOCONFIG_MEASURE_FAULTS", "0:crash@0,1:crash@0")
    code = execute([*args, "--trials", "2"])
    said = capsys.readouterr()
    assert code == 1, said.err[-3000:]
    assert "Traceback" not in said.err + said.out
    assert "no trial succeeded: 2 crash" in said.out + said.err
    assert "closest to working:" in said.out + said.err
    trials = pd.read_csv(out / "trials.csv")
    assert trials["class"].tolist() == ["crash", "crash"]
    assert trials["reason"].str.contains("crash injected").all()
    best = json.loads((out / "best.json").read_text())
    assert best["measured"]["diagnosis"][0] == "no trial succeeded: 2 crash"
    assert "no trial succeeded" in (out / "report.html").read_text()
    # The cause fixed, the same folder goes on: the next layout is measured.
    monkeypatch.delenv("AUTOCONFIG_MEASURE_FAULTS")
    code = execute([*args, "--trials", "3", "--resume"])
    said = capsys.readouterr()
    assert code == 0, said.err[-3000:]
    trials = pd.read_csv(out / "trials.csv")
    assert trials["class"].tolist() == ["crash", "crash", "ok"]
    assert trials["key"].is_unique


@pytest.mark.parametrize(("layers", "pp", "last"), [(8, 6, 3), (8, 3, 2), (10, 4, 1), (7, 7, 1)])
def test_megatron_uneven_last_stage_is_a_positive_split(layers, pp, last) -> None:
    from autoconfig.cost.inputs import even_split_layers

    per, got = (int(v) for v in even_split_layers(np.float64(layers), np.float64(pp)))
    assert got == last
    assert (layers - last) % (pp - 1) == 0 and (layers - last) // (pp - 1) == per >= 1


def test_search_emits_no_negative_layer_count(capsys) -> None:
    # Found by the CLI fuzz: tiny-gpt's 8 layers on 6 stages emitted
    # --decoder-last-pipeline-num-layers -2.
    argv = ["search", "--model", "tiny-gpt", "--gpus", "6", "--emit", "megatron", "--gbs", "1"]
    argv += ["--fix", "pp=6"]  # the layout the fuzz found, whatever ranks first
    assert execute([*argv, "--memory-headroom", "0"]) == 0
    printed = capsys.readouterr().out
    assert "--pipeline-model-parallel-size 6" in printed
    assert "--decoder-last-pipeline-num-layers 3" in printed
