"""The command line end to end: output, batch CSV, and one-line errors with exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import typer
from helpers import assert_user_error
from helpers import run_cli as run

from autoconfig.calibrate import validation
from autoconfig.cli.app import COMMAND_MODULES, register

ESTIMATE = [
    "estimate",
    "--model",
    "llama3-70b",
    "--gpu",
    "h100-sxm-80gb",
    "--gpus",
    "64",
    "--tp",
    "8",
    "--pp",
    "2",
    "--mbs",
    "1",
    "--gbs",
    "512",
    "--seq-len",
    "8192",
]


def test_estimate_prints_breakdown() -> None:
    result = run(*ESTIMATE)
    assert result.returncode == 0, result.stderr
    for part in (
        "weights",
        "optimizer states",
        "pipeline in-flight",
        "TP communication",
        "pipeline bubble",
        "tokens/s/GPU",
        "MFU",
        "of 79.6 GiB",
    ):
        assert part in result.stdout


def test_models_and_gpus_list_the_catalog() -> None:
    models = run("models")
    assert models.returncode == 0
    for name in ("gpt3-175b", "llama3-405b", "mixtral-8x22b", "mt-nlg-530b", "bloom-176b"):
        assert name in models.stdout
    gpus = run("gpus")
    assert gpus.returncode == 0 and "h200-sxm-141gb" in gpus.stdout


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--model", "llama3-71b"], ("model", "llama3-70b")),
        (["--gpu", "h100-sxm"], ("gpu", "h100-sxm-80gb")),
        (["--tp", "3"], ("tp", "heads")),
        (["--tp", "0"], ("tp",)),
        (["--gbs", "510"], ("gbs", "dp*mbs")),
        (["--dp", "8"], ("dp", "tp*pp*cp*dp", "GPU count")),
        (["--mbs", "-1"], ("mbs",)),
        (["--gpus", "abc"], ("gpus",)),
    ],
)
def test_bad_input_is_one_line_exit_2(args: list[str], needles: tuple[str, ...]) -> None:
    base = list(ESTIMATE)
    for flag, value in zip(args[::2], args[1::2], strict=True):
        if flag in base:
            base[base.index(flag) + 1] = value
        else:
            base += [flag, value]
    assert_user_error(run(*base), *needles)


def test_hf_config_json(tmp_path: Path) -> None:
    cfg = {
        "model_type": "llama",
        "num_hidden_layers": 4,
        "hidden_size": 512,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "intermediate_size": 1376,
        "vocab_size": 32000,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5,
        "hidden_act": "silu",
        "rope_theta": 10000.0,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    result = run("estimate", "--model", str(path), "--gpus", "8", "--gpu", "a100-sxm-80gb")
    assert result.returncode == 0, result.stderr
    path.write_text("{not json")
    assert_user_error(run("estimate", "--model", str(path), "--gpus", "8"), "model", "JSON")
    path.write_text(json.dumps({"hidden_size": 512}))
    assert_user_error(run("estimate", "--model", str(path), "--gpus", "8"), "num_hidden_layers")


def test_batch_estimate_keeps_going_past_bad_rows(tmp_path: Path, reference: Path) -> None:
    ref = validation.load_training_runs(reference / "training_runs.csv")
    rows = ref[ref["source_group"].isin(["Megatron-LM 2021 Table 1 (A100)", "BLOOM"])].copy()
    rows = rows.drop(columns=["fit_set"]).reset_index(drop=True)
    rows.loc[0, "tp"] = "3"  # does not divide heads
    rows.loc[1, "gpu"] = "v100"
    rows.loc[2, "gbs"] = "x"
    src, dst = tmp_path / "runs.csv", tmp_path / "pred.csv"
    rows.to_csv(src, index=False)
    result = run("estimate", "--runs", str(src), "--out", str(dst))
    assert result.returncode == 0, result.stderr
    out = pd.read_csv(dst, keep_default_na=False)
    assert list(out.columns[: len(rows.columns)]) == list(rows.columns)
    for col in (
        "pred_step_time_s",
        "pred_tokens_per_s_per_gpu",
        "pred_model_tflops_per_gpu",
        "pred_mfu",
        "pred_peak_mem_gib",
        "pred_fits",
        "error",
    ):
        assert col in out.columns
    assert "tp" in out.loc[0, "error"] and "gpu" in out.loc[1, "error"]
    assert "gbs" in out.loc[2, "error"]
    assert (out.loc[3:, "error"] == "").all()
    assert (pd.to_numeric(out.loc[3:, "pred_tokens_per_s_per_gpu"]) > 0).all()
    assert out.loc[0, "pred_tokens_per_s_per_gpu"] == ""


def test_malformed_csv_is_a_user_error(tmp_path: Path) -> None:
    src = tmp_path / "bad.csv"
    src.write_text('layers,hidden\n1,2,3,4\n"unterminated\n')
    assert_user_error(run("estimate", "--runs", str(src)), "runs")
    src.write_text("a,b\n1,2\n")
    assert_user_error(run("estimate", "--runs", str(src)), "runs", "column")
    assert_user_error(run("estimate", "--runs", str(tmp_path / "none.csv")), "no such file")


def test_every_command_is_listed_with_the_module_that_registers_it() -> None:
    """A command missing from COMMAND_MODULES would still run (an unlisted name imports every
    module), but would cost each run of it the start-up the list exists to save."""
    group = typer.main.get_command(register())
    assert set(group.commands) == set(COMMAND_MODULES)
    for name, command in group.commands.items():
        assert command.callback.__module__ == f"autoconfig.cli.{COMMAND_MODULES[name]}"


def test_a_run_imports_only_the_command_it_names() -> None:
    code = (
        "import sys; from autoconfig.cli.app import execute; "
        "code = execute(['search', '--model', 'gpt3-175b', '--gpus', '64', '--top', '1']); "
        "print(code, sorted(m for m in sys.modules if m.startswith('autoconfig.cli.')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("0 "), done.stdout + done.stderr
    assert "autoconfig.cli.search" in last
    for other in ("infer", "estimate", "plan", "train", "catalog"):
        assert f"autoconfig.cli.{other}'" not in last


def test_an_option_before_the_command_registers_every_command() -> None:
    """`autoconfig --help search` shows the group's help, which lists every command."""
    code = (
        "import sys; from autoconfig.cli.app import execute; execute(['--help', 'search']); "
        "print(sorted(m for m in sys.modules if m.startswith('autoconfig.cli.')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    last = done.stdout.strip().splitlines()[-1]
    for module in set(COMMAND_MODULES.values()):
        assert f"autoconfig.cli.{module}'" in last, done.stdout + done.stderr


def test_an_unknown_model_or_gpu_is_one_line_with_the_nearest_names() -> None:
    assert_user_error(run("search", "--model", "gpt4-1t", "--gpus", "8"), "model", "gpt3")
    done = run("search", "--model", "llama3-8b", "--gpus", "8", "--gpu", "h100")
    assert_user_error(done, "gpu", "closest: h100-sxm-80gb, h100-sxm-96gb")
