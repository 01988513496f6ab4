"""Bad input that used to pass silently, crash or blow up: each is one line naming the flag
(or the key and the file) and what is allowed, exit code 2, no traceback
(helpers.assert_user_error), and nothing written. And Ctrl-C on a multi-rank train: one line,
exit code 130, the finished steps kept."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml
from helpers import assert_user_error, run_cli

from autoconfig.base import fileio, resources
from autoconfig.base.errors import UserError
from autoconfig.layout_search import space as space_module
from autoconfig.layout_search.space import enumerate_candidates, load_space
from autoconfig.spec import catalog
from autoconfig.spec.schema import MAX_SPACE_STRUCTURES, MAX_SPACE_VALUES
from autoconfig.trainer import cli_train
from autoconfig.trainer.config import TrainConfig
from autoconfig.trainer.metrics import RunMetrics, read_metrics

SEARCH = ["search", "--model", "tiny-llama", "--gpus", "1"]


@pytest.mark.parametrize("top", ["0", "-1"])
def test_top_below_one_is_refused(top: str) -> None:
    assert_user_error(run_cli(*SEARCH, "--top", top), "top", "1..")


@pytest.mark.parametrize("fix", [["tp=2,tp=4"], ["tp=2", "--fix", "tp=4"], ["tp=1,pp=1,tp=1"]])
def test_fix_dimension_given_twice_is_refused(fix: list[str]) -> None:
    assert_user_error(run_cli(*SEARCH, "--fix", *fix), "fix", "'tp'", "twice")


@pytest.mark.parametrize("fix", ["tp=2,,pp=2", "tp=2,", ",tp=2", ""])
def test_fix_empty_item_is_refused(fix: str) -> None:
    assert_user_error(run_cli(*SEARCH, "--fix", fix), "fix", "empty")


def test_empty_out_is_refused(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert_user_error(run_cli(*SEARCH, "--out", ""), "out", "empty")
    assert list(tmp_path.iterdir()) == []  # nothing written in the current folder


def test_dot_out_still_writes_here(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = run_cli(*SEARCH, "--out", ".", "--top", "1")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "results.csv").is_file()


def test_resume_without_measure_is_refused(tmp_path) -> None:
    result = run_cli(*SEARCH, "--resume", "--out", str(tmp_path / "runs"))
    assert_user_error(result, "resume", "--measure")
    assert not (tmp_path / "runs").exists()


def test_old_gb_names_still_read_as_gib(tmp_path) -> None:
    """A GPU profile and flags written before GiB was named GiB keep working, with the same
    figure: `memory_gb: 79.6` is 79.6 GiB, and --max-memory-gb is --max-memory-gib."""
    import yaml

    from autoconfig.spec import catalog

    shipped = catalog.get_gpu("h100-sxm-80gb").model_dump(mode="json")
    shipped["memory_gb"] = shipped.pop("memory_gib")
    old = tmp_path / "old.yaml"
    old.write_text(yaml.safe_dump(shipped))
    assert catalog.get_gpu(str(old)).memory_gib == shipped["memory_gb"]
    new = run_cli("search", "--model", "tiny-llama", "--gpus", "8", "--max-memory-gib", "20")
    legacy = run_cli("search", "--model", "tiny-llama", "--gpus", "8", "--max-memory-gb", "20")
    assert new.returncode == legacy.returncode == 0
    assert new.stdout == legacy.stdout


# -- issue 35: what the training-side readers, the search space and the trainer accept ----------

H100 = "h100-sxm-80gb"
HF_ROPE = {  # a Llama-style config.json: rotary positions, SwiGLU, RMSNorm
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "intermediate_size": 128,
    "vocab_size": 256,
    "max_position_embeddings": 128,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-5,
}
RUNS_HEADER = "run_id,model,gpu,num_gpus,tp,pp,gbs,seq_len,layers,hidden,heads,vocab"


def _write_json(path: Path, data: dict) -> Path:
    path.write_text(json.dumps(data))
    return path


def _gpu_profile(tmp_path: Path, key: str, value: object) -> Path:
    """The shipped H100 profile with one figure (a dotted key) replaced, as a YAML file."""
    data = catalog.get_gpu(H100).model_dump(mode="json")
    *parents, leaf = key.split(".")
    node = data
    for part in parents:
        node = node[part]
    node[leaf] = value
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("peak_tflops.bf16", -989.0),
        ("peak_tflops.bf16", 0),
        ("peak_tflops.fp8", -1979.0),
        ("memory_gib", 0),
        ("memory_tb_s", -3.35),
        ("cluster.intra_node_gb_s", 0),
        ("tdp_w", -700),
    ],
)
def test_a_gpu_profile_figure_that_must_be_positive_is_refused_on_load(tmp_path, key, value):
    """A negative peak was ranked at MFU -288,575%, and 0 crashed with --out: now the profile
    is refused on load, naming the key and the file, before anything is searched or written."""
    path = _gpu_profile(tmp_path, key, value)
    out = tmp_path / "runs"
    result = run_cli(*SEARCH[:3], "--gpus", "8", "--gpu", str(path), "--out", str(out))
    assert_user_error(result, key, "bad.yaml", "greater than 0")
    assert not out.exists()


def test_a_model_profile_count_that_must_be_positive_is_refused_on_load(tmp_path, monkeypatch):
    folder = tmp_path / "profiles" / "models"
    folder.mkdir(parents=True)
    bad = catalog.get_model("tiny-llama").model_dump(mode="json") | {"layers": 0}
    (folder / "bad.yaml").write_text(yaml.safe_dump(bad))
    monkeypatch.setenv(resources.PROFILES_ENV, str(tmp_path / "profiles"))
    catalog.models.cache_clear()
    try:
        with pytest.raises(UserError, match=r"bad\.yaml: layers: .*greater than 0"):
            catalog.models()
    finally:
        catalog.models.cache_clear()  # the shipped catalog again for the next test


def _runs(tmp_path: Path, rows: list[str]) -> tuple[Path, Path]:
    src = tmp_path / "runs.csv"
    src.write_text("\n".join([RUNS_HEADER, *rows]) + "\n")
    return src, tmp_path / "pred.csv"


@pytest.mark.parametrize("bad", [0, 1, 2])
def test_a_runs_row_with_an_extra_cell_is_that_rows_error_wherever_it_is(tmp_path, bad):
    """One extra cell in the first data row used to shift every column (run_id held the
    model); on a later row it refused the whole file. Now it is that row's error, with its line
    and cell counts, and the other rows are estimated."""
    rows = [f"r{i},llama3-8b,{H100},8,{2**i},1,64,2048,,,," for i in range(3)]
    rows[bad] += ",BLOOM"
    src, dst = _runs(tmp_path, rows)
    result = run_cli("estimate", "--runs", str(src), "--out", str(dst))
    assert result.returncode == 0, result.stderr
    out = pd.read_csv(dst, dtype=str, keep_default_na=False)
    assert list(out["run_id"]) == ["r0", "r1", "r2"] and set(out["model"]) == {"llama3-8b"}
    assert out.loc[bad, "error"] == f"runs: line {bad + 2} has 13 cells, the header 12"
    good = out.drop(index=bad)
    assert (good["error"] == "").all(), good["error"].tolist()
    assert (pd.to_numeric(good["pred_tokens_per_s_per_gpu"]) > 0).all()


def test_a_serving_row_with_an_extra_cell_is_that_rows_error(tmp_path) -> None:
    """infer --runs reads the same CSV: the row is cut, not taken, and says why."""
    src, dst = tmp_path / "points.csv", tmp_path / "pred.csv"
    row = f"llama3-8b,{H100},1,1,128,32,4"
    src.write_text(f"model,gpu,tp,pp,input_len,output_len,batch_size\n{row},EXTRA\n{row}\n")
    result = run_cli("infer", "--runs", str(src), "--out", str(dst))
    assert result.returncode == 0, result.stderr
    out = pd.read_csv(dst, dtype=str, keep_default_na=False)
    assert list(out["error"]) == ["runs: line 2 has 8 cells, the header 7", ""]


def test_a_runs_file_past_its_row_limit_or_naming_a_column_twice_is_refused(tmp_path, monkeypatch):
    src, _ = _runs(tmp_path, [f"r{i},llama3-8b,{H100},8,1,1,64,2048,,,," for i in range(3)])
    monkeypatch.setattr(fileio, "MAX_CSV_ROWS", 2)
    assert_user_error(run_cli("estimate", "--runs", str(src)), "runs", "more than the 2 rows")
    monkeypatch.undo()
    src.write_text("tp,pp,tp\n1,1,2\n")
    assert_user_error(run_cli("estimate", "--runs", str(src)), "runs", "'tp' twice")


@pytest.mark.parametrize(
    ("fields", "needle"),
    [({"head_dim": 7}, "head_dim"), ({"hidden_size": 66, "num_attention_heads": 2}, "heads")],
)
def test_a_config_no_trainer_can_run_is_refused_by_search_and_train_alike(
    tmp_path, fields, needle
) -> None:
    """Rotary positions with an odd head width: searched before, while train crashed."""
    path = _write_json(tmp_path / "config.json", HF_ROPE | fields)
    out = tmp_path / "run"
    searched = run_cli("search", "--model", str(path), "--gpus", "1")
    trained = run_cli("train", "--model", str(path), "--device", "cpu", "--out", str(out))
    assert_user_error(searched, needle, "even")
    assert_user_error(trained, needle, "even")
    assert searched.stderr == trained.stderr
    assert not out.exists()


def test_an_odd_head_width_without_rotary_positions_is_searched_and_trained(tmp_path) -> None:
    learned = {k: v for k, v in HF_ROPE.items() if k != "rope_theta"} | {"head_dim": 7}
    path = _write_json(tmp_path / "config.json", learned)
    assert run_cli("search", "--model", str(path), "--gpus", "1", "--top", "1").returncode == 0
    flags = ["--device", "cpu", "--steps", "1", "--warmup", "0", "--seq-len", "16"]
    trained = run_cli("train", "--model", str(path), *flags, "--out", str(tmp_path / "run"))
    assert trained.returncode == 0, trained.stdout + trained.stderr
    assert read_metrics(tmp_path / "run" / "metrics.json").status == "ok"


def test_a_tp_that_does_not_split_the_mlp_width_is_neither_searched_nor_trained(tmp_path):
    """tp 2 on an MLP of width 131: ranked by the search, then a crash in the trainer's sharded
    matmul. Now the search leaves it out and train refuses it, naming tp."""
    odd = _write_json(tmp_path / "config.json", HF_ROPE | {"intermediate_size": 131})
    even = catalog.get_model(str(_write_json(tmp_path / "even.json", HF_ROPE)))
    found = {}
    for name, model in (("odd", catalog.get_model(str(odd))), ("even", even)):
        found[name] = enumerate_candidates(
            model, 2, 8, 64, load_space(), 8, catalog.get_framework("megatron")
        )
    assert set(found["even"].table["tp"]) == {1, 2}
    assert set(found["odd"].table["tp"]) == {1}
    assert found["odd"].dropped["tp does not divide the MLP width"] > 0
    trained = run_cli("train", "--model", str(odd), "--tp", "2", "--gpus", "2", "--device", "cpu")
    assert_user_error(trained, "tp", "MLP width (131)")
    # estimate refuses it too, and its fit advice never proposes it
    estimated = run_cli("estimate", "--model", str(odd), "--gpus", "2", "--tp", "2")
    assert_user_error(estimated, "tp", "MLP width (131)")


def test_train_refuses_more_layers_than_the_model_has() -> None:
    """--layers keeps the first n of the model's layers: 100 of tiny-llama's 8 trained 100."""
    result = run_cli("train", "--model", "tiny-llama", "--layers", "100", "--device", "cpu")
    assert_user_error(result, "layers", "8 layers tiny-llama has", "got 100")


@pytest.mark.parametrize(
    "flag", [["--tp", "4"], ["--steps", "5"], ["--gpus", "2"], ["--no-sp"], ["--model", "x"]]
)
def test_a_flag_beside_train_config_is_refused_not_ignored(tmp_path, flag) -> None:
    """`train --config FILE --tp 4` ran the file's tp silently; the file states the whole run."""
    cfg = _write_json(tmp_path / "trial.json", {"model": "tiny-llama", "device": "cpu"})
    result = run_cli("train", "--config", str(cfg), *flag, "--out", str(tmp_path / "run"))
    assert_user_error(result, flag[0].removeprefix("--no-").removeprefix("--"), "--config")
    assert not (tmp_path / "run").exists()


def test_train_config_with_only_out_beside_it_is_taken(tmp_path, monkeypatch) -> None:
    seen: list[TrainConfig] = []

    def keep(cfg: TrainConfig, out: Path) -> tuple[int, RunMetrics]:
        seen.append(cfg)
        raise SystemExit(0)  # the CLI's own exit, before anything is shown

    monkeypatch.setattr(cli_train, "launch_local", keep)
    cfg = _write_json(tmp_path / "trial.json", {"model": "tiny-llama", "tp": 2, "device": "cpu"})
    assert run_cli("train", "--config", str(cfg), "--out", str(tmp_path)).returncode == 0
    assert [c.tp for c in seen] == [2]


@pytest.mark.parametrize(
    ("flag", "name", "text", "key"),
    [
        ("--gpu", "dup.yaml", "name: x\nchip: h100\nname: y\n", "name"),  # a GPU profile
        ("--space", "dup.yaml", "mbs: [1]\npp: [1, 2]\nmbs: [2]\n", "mbs"),
        (
            "--gpu",
            "dup.yaml",
            "cluster:\n  gpus_per_node: 8\n  gpus_per_node: 4\n",
            "gpus_per_node",
        ),
        ("--model", "config.json", '{"hidden_size": 64, "hidden_size": 128}', "hidden_size"),
    ],
)
def test_a_key_given_twice_is_refused_naming_the_key_and_file(tmp_path, flag, name, text, key):
    """YAML and JSON keep the last of a key given twice, silently: now it is refused."""
    path = tmp_path / name
    path.write_text(text)
    result = run_cli(*SEARCH[:3], "--gpus", "8", flag, str(path))
    assert_user_error(result, f"'{key}'", "twice", name)


def test_a_train_config_key_given_twice_is_refused(tmp_path) -> None:
    cfg = tmp_path / "trial.json"
    cfg.write_text('{"model": "tiny-llama", "tp": 1, "tp": 4}')
    assert_user_error(run_cli("train", "--config", str(cfg)), "config", "'tp'", "twice")


LONG = "a" * 300


@pytest.mark.parametrize(
    "argv",
    [
        [*SEARCH, "--out", f"/tmp/{LONG}"],
        ["search", "--model", f"/tmp/{LONG}.json", "--gpus", "1"],
        [*SEARCH, "--space", f"/tmp/{LONG}.yaml"],
        [*SEARCH, "--gpu", f"/tmp/{LONG}.yaml"],
        [*SEARCH, "--profile", f"/tmp/{LONG}.yaml"],
        ["estimate", "--runs", f"/tmp/{LONG}.csv"],
        ["estimate", "--model", "tiny-llama", "--gpus", "1", "--out", f"/tmp/{LONG}.csv"],
        ["train", "--config", f"/tmp/{LONG}.json"],
        ["train", "--model", "tiny-llama", "--device", "cpu", "--out", f"/tmp/x/{LONG}"],
        ["calibrate", f"/tmp/{LONG}"],
        ["search", "--model", "tiny-llama", "--gpus", "1", "--out", "/tmp/" + "b/" * 2100],
    ],
)
def test_a_path_the_filesystem_cannot_name_is_one_line(argv) -> None:
    """A part over 255 bytes raised OSError (File name too long) on every path flag."""
    result = run_cli(*argv)
    assert_user_error(result, "more than the")
    assert "255" in result.stderr or "4,096" in result.stderr


def _unblock_after(path: Path, seconds: float) -> threading.Timer:
    """Opens the FIFO's writing end after `seconds`, so a reader that wrongly opened it ends
    (and the test fails) instead of hanging the suite."""

    def release() -> None:
        with contextlib.suppress(OSError):
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))

    timer = threading.Timer(seconds, release)
    timer.start()
    return timer


@pytest.mark.parametrize(
    ("flag", "argv"),
    [
        ("space", [*SEARCH, "--space"]),
        ("model", ["search", "--gpus", "1", "--model"]),
        ("profile", [*SEARCH, "--gpu"]),
        ("runs", ["estimate", "--runs"]),
        ("config", ["train", "--config"]),
    ],
)
@pytest.mark.parametrize("special", ["fifo", "/dev/zero"])
def test_a_pipe_or_device_is_refused_before_reading(tmp_path, flag, argv, special) -> None:
    """A FIFO blocked forever and /dev/zero grew without end: only regular files are read."""
    path = Path(special)
    if special == "fifo":
        path = tmp_path / "input.json"
        os.mkfifo(path)
        timer = _unblock_after(path, 20)
    begin = time.monotonic()
    result = run_cli(*argv, str(path))
    if special == "fifo":
        timer.cancel()
    assert time.monotonic() - begin < 15
    assert_user_error(result, flag, "not a regular file")


def _space(tmp_path: Path, **lists: list) -> Path:
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(lists))
    return path


def test_a_search_space_list_past_its_limit_is_refused_before_parsing(tmp_path) -> None:
    """100,000 micro-batch sizes grew to 22.5 GB (10,000 took 85 s)."""
    space = _space(tmp_path, mbs=list(range(1, 100_001)))
    begin = time.monotonic()
    result = run_cli(*SEARCH, "--space", str(space))
    assert time.monotonic() - begin < 10
    assert_user_error(result, "mbs", "100,000 values", f"the {MAX_SPACE_VALUES}")


def test_search_space_lists_that_cross_past_the_limit_are_refused(tmp_path) -> None:
    values = list(range(1, MAX_SPACE_VALUES + 1))
    space = _space(tmp_path, tp=values, pp=values, vp=values, cp=[1, 2])
    result = run_cli(*SEARCH, "--space", str(space))
    assert_user_error(result, "tp, pp, vp, cp", f"{MAX_SPACE_STRUCTURES:,} one search")


def test_a_search_that_would_cross_too_many_layouts_is_refused_before_building_them(
    monkeypatch,
) -> None:
    """The lists pass one by one, but the structures that survive the rules, crossed with the
    settings, are checked before the second pass builds them (the limit is in the message)."""
    monkeypatch.setattr(space_module, "MAX_CROSSED_LAYOUTS", 100)
    result = run_cli("search", "--model", "tiny-llama", "--gpus", "8")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    # after the progress line the search prints once it starts, one error line
    progress, error = result.stderr.strip().splitlines()
    assert progress.startswith("searching tiny-llama")
    assert error.startswith("error: space: ") and "more than the 100 one search crosses" in error


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({"num_hidden_layers": 100_000}, "num_hidden_layers: must be in 1..1,024"),
        (
            {"num_hidden_layers": 1024, "hidden_size": 2**24, "intermediate_size": 2**24},
            "parameters, more than",
        ),
    ],
)
def test_a_config_json_past_the_model_limits_is_refused(tmp_path, fields, needle) -> None:
    path = _write_json(tmp_path / "config.json", HF_ROPE | fields)
    assert_user_error(run_cli("search", "--model", str(path), "--gpus", "8"), "model", needle)


def test_ctrl_c_on_a_multi_rank_train_is_one_line_exit_130_and_keeps_the_finished_steps(
    tmp_path,
) -> None:
    """Ctrl-C reaches the launcher and every rank (one process group). Rank 0 hangs at its
    second step (fault sleep@0, which says so on stderr) and rank 1 waits for it, so exactly
    one step is finished when the signal comes."""
    cfg = {"model": "tiny-llama", "world_size": 2, "layers": 2, "seq_len": 16, "gbs": 2}
    cfg |= {"steps": 50, "warmup": 0, "device": "cpu", "precision": "fp32", "fault": "sleep@0"}
    config, out = _write_json(tmp_path / "trial.json", cfg), tmp_path / "run"
    argv = [sys.executable, "-m", "autoconfig.cli", "train", "--config", str(config)]
    proc = subprocess.Popen(
        [*argv, "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    said: list[str] = []

    def kill() -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)

    watchdog = threading.Timer(180, kill)  # whatever happens, the suite does not hang here
    watchdog.start()
    try:
        for line in proc.stderr:  # until rank 0 hangs: its first step has ended
            said.append(line)
            if "sleeping (injected fault" in line:
                break
        else:
            pytest.fail("rank 0 never reached its injected hang:\n" + "".join(said))
        os.killpg(proc.pid, signal.SIGINT)
        stdout, rest = proc.communicate(timeout=60)
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            kill()
    stderr = "".join(said) + rest
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr + stdout
    lines = [line for line in stderr.splitlines() if "interrupted" in line]
    assert lines == [f"interrupted: interrupted after 1 of 50 steps; metrics: {out}/metrics.json"]
    metrics = read_metrics(out / "metrics.json")
    assert metrics.status == "interrupted"
    assert len(metrics.step_times_s) == len(metrics.losses) == 1


def test_train_shows_mfu_in_percent_and_memory_in_gib(tmp_path, capsys) -> None:
    """`train`'s table speaks the units every other table does: MFU as a percentage, memory
    in GiB (it showed the fraction 0.41 and "GB" holding GiB)."""
    from autoconfig.trainer.cli_train import show
    from autoconfig.trainer.metrics import RunMetrics

    metrics = RunMetrics(
        status="ok",
        config={},
        median_step_time_s=1.0,
        tokens_per_s_per_gpu=1000.0,
        mfu=0.41,
        gpu_profile="h100-sxm-80gb",
        predicted={"pred_mfu": 0.45, "pred_step_time_s": 0.9},
    )
    show(metrics, tmp_path)
    text = capsys.readouterr().out
    assert "MFU %" in text and "41" in text and "45" in text
    assert "0.41" not in text and "GiB" in text and " GB " not in text


def test_an_fp32_trials_predicted_peak_grows_with_its_parts() -> None:
    """A CPU (fp32) trial holds its weights, gradients and activations in 4 bytes: the
    predicted peak grows by what its parts grow (it stayed at the 16-bit peak once the parts
    were named in GiB)."""
    from autoconfig.trainer.prediction import FP32_SCALE, as_fp32

    parts = {k: 1.0 for k in FP32_SCALE if k.endswith("_gib")}
    out = as_fp32(parts | {"pred_peak_mem_gib": 20.0}, "cpu-gloo")
    grown = sum(out[k] - 1.0 for k in parts)
    assert grown > 0 and out["pred_peak_mem_gib"] >= 20.0 + grown


def test_plan_refuses_a_gpu_count_per_node_below_one() -> None:
    result = run_cli(
        "plan", "--model", "llama3-70b", "--tokens", "1e12", "--max-days", "30",
        "--gpus-per-node", "0",
    )  # fmt: skip
    assert_user_error(result, "gpus-per-node")


def test_a_plain_search_into_a_measured_searchs_folder_is_refused(tmp_path) -> None:
    """A plain `search --out D` replaced the report set of the measured search in D, whose
    trials.csv and measured.csv links then pointed nowhere: refused, nothing touched."""
    from autoconfig.measure.result import STUDY_FILE

    (tmp_path / STUDY_FILE).write_bytes(b"")
    (tmp_path / "trials.csv").write_text("trial\n1\n")
    result = run_cli("search", "--model", "tiny-llama", "--gpus", "8", "--out", str(tmp_path))
    assert_user_error(result, "out", STUDY_FILE, "--resume")
    assert (tmp_path / "trials.csv").read_text() == "trial\n1\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([STUDY_FILE, "trials.csv"])


def test_a_full_disk_is_one_line_and_keeps_what_was_written(tmp_path, monkeypatch) -> None:
    """A full disk while writing the report set gave chained tracebacks: one line naming the
    file and the cause, a non-zero exit, and the set written before stays whole."""
    import errno

    from autoconfig.base import fileio

    out = tmp_path / "run"
    first = run_cli("search", "--model", "tiny-llama", "--gpus", "8", "--out", str(out))
    assert first.returncode == 0, first.stderr
    before = (out / "results.csv").read_text()

    def full(folder, files):
        raise OSError(errno.ENOSPC, "No space left on device", str(folder / "results.csv"))

    monkeypatch.setattr(fileio, "write_set", full)
    monkeypatch.setattr("autoconfig.report.files.write_set", full)
    result = run_cli("search", "--model", "tiny-llama", "--gpus", "4", "--out", str(out))
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert "Traceback" not in result.stderr and "No space left on device" in lines[-1]
    assert "results.csv" in lines[-1]
    assert (out / "results.csv").read_text() == before


@pytest.mark.parametrize(
    "args",
    [
        ["train", "--model", "tiny-llama", "--device", "cpu", "--steps", "3"],
        ["plan", "--model", "llama3-70b", "--tokens", "1e12", "--max-days", "30"],
        ["estimate", "--model", "llama3-70b", "--gpus", "64", "--tp", "8"],
    ],
)
def test_an_empty_out_is_refused_on_every_command(args, tmp_path, monkeypatch) -> None:
    """`--out ''` reads as '.': plan wrote plan.html into the current folder."""
    monkeypatch.chdir(tmp_path)
    assert_user_error(run_cli(*args, "--out", ""), "out", "must not be empty")
    assert list(tmp_path.iterdir()) == []
