"""What is declared once stays declared once: expert-tensor parallelism reaches every entry
point, the defaults live in autoconfig.spec.defaults alone, a training request has one
resolver, CPU-trial settings are shared, every reader parses yes/no and integers alike, the
trainer states no layout rule twice, and search, estimate and infer take the same leading
arguments."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pandas as pd
import pytest
from helpers import assert_user_error, run_cli

from autoconfig import api
from autoconfig.base.errors import UserError
from autoconfig.layout_search import run as search_run
from autoconfig.layout_search.space import load_space
from autoconfig.rows import training as rows
from autoconfig.spec import defaults, layout
from autoconfig.trainer.config import TrainConfig

PACKAGE = Path(__file__).resolve().parent.parent / "autoconfig"

# -- 1. etp reaches the command line and the API ------------------------------------------------

MOE = {"tp": 2, "pp": 2, "ep": 4}  # mixtral-8x7b on 32 GPUs: dp 8, experts over ep*etp


def test_etp_reaches_the_estimate_and_changes_the_prediction() -> None:
    whole, split = (api.estimate("mixtral-8x7b", 32, etp=e, **MOE).iloc[0] for e in (1, 2))
    assert (int(whole["etp"]), int(split["etp"])) == (1, 2)
    # experts split over two ranks hold half the expert weights each
    assert float(split["pred_peak_mem_gib"]) < float(whole["pred_peak_mem_gib"])


def test_estimate_takes_etp_as_a_flag() -> None:
    args = ["estimate", "--model", "mixtral-8x7b", "--gpus", "32", "--tp", "2", "--pp", "2"]
    given = run_cli(*args, "--ep", "4", "--etp", "2")
    assert given.returncode in (0, 1), given.stderr  # 1: it does not fit, with advice
    assert "layout   dp8 tp2 pp2 ep4 etp2 sp" in given.stdout
    plain = run_cli(*args, "--ep", "4")
    assert "etp2" not in plain.stdout.split("Memory per GPU")[0]


def test_train_takes_etp_as_a_flag(monkeypatch) -> None:
    from autoconfig.trainer import cli_train

    seen: list[dict] = []
    monkeypatch.setattr(cli_train, "run", lambda **kw: seen.append(kw["fields"]) or 0)
    base = ["train", "--model", "tiny-moe", "--tp", "2", "--gpus", "2", "--device", "cpu"]
    assert run_cli(*base, "--etp", "1").returncode == 0
    assert run_cli(*base).returncode == 0
    assert seen[0]["etp"] == 1
    assert seen[1]["etp"] is None  # left to the trainer: experts follow tp on an MoE model


def test_train_refuses_an_etp_the_bundled_trainer_cannot_run() -> None:
    result = run_cli(
        "train", "--model", "tiny-moe", "--tp", "4", "--etp", "2", "--gpus", "4", "--device", "cpu"
    )
    assert_user_error(result, "etp", "got etp 2")


# -- 2. the defaults are declared in autoconfig/spec/defaults.py alone ----------------------------

DEFAULT_LITERALS = {
    defaults.GPU,
    defaults.FRAMEWORK.value,
    defaults.PRECISION.value,
    defaults.CPU_TRIAL_GPU,
}


def _modules() -> list[Path]:
    """The API, the search and the command line: where the shared defaults are used."""
    return [
        PACKAGE / "api.py",
        *sorted((PACKAGE / "layout_search").glob("*.py")),
        *sorted((PACKAGE / "cli").glob("*.py")),
    ]


@pytest.mark.parametrize("path", _modules(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_no_default_is_written_beside_the_defaults_module(path: Path) -> None:
    written = [
        f"line {node.lineno}: {node.value!r}"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and node.value in DEFAULT_LITERALS
    ]
    assert written == [], f"{path.name} writes a default of autoconfig.spec.defaults: {written}"


@pytest.mark.parametrize("function", [api.search, api.estimate, api.infer, search_run.make_request])
def test_the_api_and_the_search_default_to_the_shared_values(function) -> None:
    params = inspect.signature(function).parameters
    assert params["gpu"].default == defaults.GPU
    if "framework" in params:
        assert params["framework"].default == defaults.FRAMEWORK.value
        assert params["precision"].default == defaults.PRECISION.value


# -- 3. one resolver: estimate refuses what the search refuses ----------------------------------

REQUEST_PROBES = [
    {"seq_len": 10**6},  # beyond the model's context
    {"precision": "fp8", "framework": "deepspeed"},  # a precision the framework cannot train in
    {"precision": "nvfp4"},  # one the GPU has no tensor cores for
    {"max_memory_gib": -1},
    {"memory_headroom": 1.5},
    {"gpus_per_node": 0},
    {"gpu": "h900"},
    {"framework": "nemo2000"},
]


@pytest.mark.parametrize("probe", REQUEST_PROBES, ids=lambda p: ",".join(p))
def test_estimate_and_search_resolve_a_request_alike(probe: dict) -> None:
    refusals = []
    for ask in (api.estimate, api.search):
        with pytest.raises(UserError) as caught:
            ask("llama3-8b", 8, **probe)
        refusals.append(str(caught.value))
    assert refusals[0] == refusals[1]


def test_estimate_takes_the_batch_rule_from_the_resolved_request() -> None:
    row = api.estimate("llama3-8b", 8, tp=2).iloc[0]
    request = search_run.make_request("llama3-8b", 8)
    assert int(row["gbs"]) == request.gbs and row["gbs_rule"] == request.gbs_rule


# -- 4. CPU-trial settings come from the shared defaults ----------------------------------------


def test_a_measured_search_on_cpu_takes_the_shared_trial_defaults(monkeypatch, tmp_path) -> None:
    from autoconfig.cli import search as command

    monkeypatch.setattr(defaults, "CPU_TRIAL_SEQUENCES_PER_RANK", 2)  # read when it runs
    asked: list = []
    monkeypatch.setattr(command, "_check_measure", lambda opts: None)
    monkeypatch.setattr(command, "_measure", lambda result, *rest: asked.append(result) or 0)
    args = ["--model", "tiny-llama", "--gpus", "4", "--measure", "--device", "cpu"]
    result = run_cli("search", *args, "--out", str(tmp_path / "m"))
    assert result.returncode == 0, result.stderr
    request = asked[0].request
    assert request.gpu.name == defaults.CPU_TRIAL_GPU
    assert request.gbs == defaults.cpu_trial_gbs(4) == 8


def test_the_trial_gpu_is_the_shared_one_only_for_cpu_trials() -> None:
    assert defaults.gpu_for(trials_on_cpu=True) == defaults.CPU_TRIAL_GPU
    assert defaults.gpu_for(trials_on_cpu=False) == defaults.GPU


# -- 5. one reading of yes/no and of integers: CSV rows, --fix and YAML ---------------------------

WORDS = ["t", "f", "T", "on", "off", "yes", "no", "y", "n", "true", "false", "1", "0", "maybe"]
TRUE = {"t", "on", "yes", "y", "true", "1"}


def _fix(dimension: str, word: str) -> object:
    try:
        return layout.BY_NAME[dimension].plain(layout.parse_fix([f"{dimension}={word}"])[dimension])
    except UserError as exc:
        assert dimension in str(exc)
        return "refused"


def _yaml(dimension: str, word: str, folder: Path) -> object:
    path = folder / f"{dimension}.yaml"
    path.write_text(f"{dimension}: [{word}]\n")
    try:
        (value,) = getattr(load_space(path), dimension)
    except UserError as exc:
        assert dimension in str(exc)
        return "refused"
    return layout.BY_NAME[dimension].plain(value)


def _csv_flag(word: str) -> object:
    table = pd.DataFrame({"sp": [word]})
    err = rows.Errors(table.index)
    value = rows.flag(table, "sp", False, err)
    return "refused" if err.bad[0] else bool(value.iloc[0])


@pytest.mark.parametrize("word", WORDS)
def test_every_reader_takes_the_same_yes_and_no(word: str, tmp_path) -> None:
    read = {"fix": _fix("sp", word), "yaml": _yaml("sp", word, tmp_path), "csv": _csv_flag(word)}
    assert len(set(read.values())) == 1, read
    assert read["fix"] == ("refused" if word == "maybe" else word.lower() in TRUE)


INTEGERS = ["16", "16.0", "1.6e1", "1_6", " 16 ", "16.5", "x", "0", "-2"]


def _csv_integer(text: str) -> object:
    required = {c: ["8"] for c in rows.REQUIRED if c != "gpu"}
    table = pd.DataFrame({**required, "gpu": ["h100-sxm-80gb"], "tp": [text]})
    err = rows.Errors(table.index)
    value = rows.integers(table, err)["tp"].iloc[0]
    return "refused" if err.bad[0] else int(value)


@pytest.mark.parametrize("text", INTEGERS)
def test_every_reader_takes_the_same_integers(text: str, tmp_path) -> None:
    read = {"fix": _fix("tp", text), "yaml": _yaml("tp", text, tmp_path), "csv": _csv_integer(text)}
    assert len(set(read.values())) == 1, read


# -- 6. the trainer states no layout rule twice -------------------------------------------------

# Layouts that break a rule of autoconfig.spec.layout and none of the trainer's own.
SHARED_BREAKS = {
    "tp must divide heads": {"tp": 11},  # 8 heads; 11 divides tiny-llama's MLP width (352)
    "virtual stages need pp > 1": {"vp": 2},
    "gbs divisible by dp*mbs": {"dp": 2, "gbs": 3},
    "sp needs tp > 1": {"sp": True},
}


@pytest.mark.parametrize("fields", SHARED_BREAKS.values(), ids=list(SHARED_BREAKS))
def test_the_trainer_leaves_the_layout_rules_to_the_layout(fields: dict, monkeypatch) -> None:
    cfg = TrainConfig(model="tiny-llama", seq_len=64, **fields)
    with pytest.raises(UserError):  # the shared rules refuse it, once
        cfg.checked()
    monkeypatch.setattr(layout, "first_broken", lambda columns: "")
    assert cfg.checked() is cfg  # the trainer's own rules do not restate them


def test_the_trainer_keeps_its_own_refusals() -> None:
    with pytest.raises(UserError, match="sp: a slice runs one device"):
        TrainConfig(model="tiny-llama", tp=2, sp=True, slice=True).checked()
    with pytest.raises(UserError, match="got etp 2"):
        TrainConfig(model="tiny-moe", tp=4, etp=2, dp=1).checked()


# -- 7. one argument order: (model, gpus, gpu=DEFAULT, *, ...) ----------------------------------


@pytest.mark.parametrize("function", [api.search, api.estimate, api.infer])
def test_search_estimate_and_infer_take_the_same_leading_arguments(function) -> None:
    params = list(inspect.signature(function).parameters.values())
    assert [p.name for p in params[:3]] == ["model", "gpus", "gpu"]
    assert params[2].default == defaults.GPU
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params[3:])


def test_the_old_order_is_refused_not_misread() -> None:
    with pytest.raises(UserError, match="gpus"):
        api.estimate("llama3-8b", "h100-sxm-80gb", 8)  # type: ignore[arg-type]
    with pytest.raises(UserError, match="gpus"):
        api.search("llama3-8b", "h100-sxm-80gb", 8)  # type: ignore[arg-type]
