"""The example inputs README points a newcomer at: every examples/ file README names is shipped,
each README command that reads one runs to exit code 0 (in-process, helpers.run_cli) and
predicts every row, docs/inputs.md lists exactly the columns the readers consult (so the
column reference cannot go stale), and README's up-front figures and conventions are what
the code computes."""

from __future__ import annotations

import importlib.util
import io
import json
import re
import shlex
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pandas as pd
import pytest
from helpers import run_cli

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: import-linter brings tomli
    import tomli as tomllib  # type: ignore[no-redef]

from autoconfig.rows import serving, training
from autoconfig.rows.resolve import read_resolved
from autoconfig.serve import workload
from autoconfig.spec import catalog, vocab
from autoconfig.trainer.config import load_config

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
INPUTS_DOC = ROOT / "docs" / "inputs.md"
EXAMPLES = ROOT / "examples"
ASSETS = ROOT / "autoconfig" / "report" / "assets"
# A path under examples/ as README writes it (in commands, Python and links).
EXAMPLE_PATH = re.compile(r"examples/[\w.-]+(?:/[\w.-]+)*")


def _script() -> ModuleType:
    """scripts/readme_examples.py as a module: its reading of README's commands is the one the
    quoted-output check uses."""
    path = ROOT / "scripts" / "readme_examples.py"
    spec = importlib.util.spec_from_file_location("readme_examples", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def _named_in(text: str) -> set[str]:
    return {m.rstrip(".") for m in EXAMPLE_PATH.findall(text)}


def _example_commands() -> list[list[str]]:
    """README's shell commands that read a file under examples/."""
    commands = _script().readme_commands(README.read_text())
    return [argv for argv in commands if any(_named_in(arg) for arg in argv)]


COMMANDS = _example_commands()


def test_every_example_readme_names_is_shipped() -> None:
    named = _named_in(README.read_text())
    assert named, "README names no file under examples/"
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert not missing, f"README names examples that are not shipped: {missing}"


def test_every_shipped_example_is_run_by_a_readme_command() -> None:
    """Nothing under examples/ goes untested: each input file is read by a command of README's
    (its own README.md describes them and is read by people only)."""
    shipped = {
        p.relative_to(ROOT).as_posix()
        for p in EXAMPLES.rglob("*")
        if p.is_file() and p.name != "README.md"
    }
    used = {path for argv in COMMANDS for arg in argv for path in _named_in(arg)}
    assert shipped, "examples/ holds no input files"
    assert not shipped - used, f"shipped but run by no README command: {sorted(shipped - used)}"


def _flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


@pytest.mark.parametrize("argv", COMMANDS, ids=[shlex.join(a)[:80] for a in COMMANDS])
def test_readme_command_runs_on_its_example(argv: list[str], tmp_path, monkeypatch) -> None:
    """The command as README shows it, run from the repository root (examples/ paths are
    relative to it) with its --out redirected into a scratch folder."""
    monkeypatch.chdir(ROOT)
    if argv[0] == "torchrun":
        # One rank per process under torchrun: the trainer's own loader checks the file (every
        # layout rule, before any process starts), and its ranks are the processes README
        # starts.
        config = load_config(Path(_flag(argv, "--config") or ""))
        assert config.world == int(_flag(argv, "--nproc-per-node") or 0)
        return
    assert argv[0] == "autoconfig", argv
    args = list(argv[1:])
    out = _flag(args, "--out")
    if out is not None:
        args[args.index("--out") + 1] = str(tmp_path / out)
    result = run_cli(*args)
    assert result.returncode == 0, result.stderr
    if "--runs" in args:  # every row predicted, none refused
        written = tmp_path / out if out is not None else io.StringIO(result.stdout)
        table = pd.read_csv(written, keep_default_na=False)
        given = pd.read_csv(_flag(args, "--runs") or "", dtype=str, keep_default_na=False)
        assert len(table) == len(given)
        assert (table["error"] == "").all(), table.loc[table["error"] != "", "error"].tolist()
        speed = {
            "estimate": "pred_tokens_per_s_per_gpu",
            "infer": "pred_output_tokens_per_s_per_gpu",
        }
        assert (pd.to_numeric(table[speed[args[0]]]) > 0).all()
    if "--workload" in args:  # the file's lengths were simulated, not the default chat turn
        assert Path(_flag(args, "--workload") or "").name in result.stdout


# -- the column reference ----------------------------------------------------------------------


class Consulted(pd.DataFrame):
    """A table that notes every column name a reader looks up in it (`df[col]`, `col in df`),
    present or not, through the copies the reader makes of it."""

    names: set[str] = set()  # noqa: RUF012 (reset by each test)

    @property
    def _constructor(self):  # type: ignore[override]
        return Consulted

    def __getitem__(self, key):
        if isinstance(key, str):
            Consulted.names.add(key)
        return super().__getitem__(key)

    def __contains__(self, key) -> bool:
        if isinstance(key, str):
            Consulted.names.add(key)
        return super().__contains__(key)


def _consulted(read, example: str, required: tuple[str, ...]) -> set[str]:
    """The columns `read` consults given the first row of `example`, cut to `required` (the
    columns it refuses a file without), so every other column is looked up while absent."""
    row = pd.read_csv(EXAMPLES / example, dtype=str, keep_default_na=False).head(1)
    Consulted.names = set()
    read(Consulted(row[list(required)]))
    return set(Consulted.names)


def _documented(section: str) -> set[str]:
    """The column names in the first cells of docs/inputs.md's tables under `## {section}`."""
    text = INPUTS_DOC.read_text()
    parts = re.split(r"^## ", text, flags=re.MULTILINE)
    body = next((p for p in parts if p.startswith(section)), None)
    assert body is not None, f"docs/inputs.md has no section '## {section}'"
    names: set[str] = set()
    for line in body.splitlines():
        cells = line.split("|")
        if len(cells) > 2 and not set(cells[1].strip()) <= set("-: "):
            names |= set(re.findall(r"`(\w+)`", cells[1]))
    return names - {"column"}


def _same(documented: set[str], consulted: set[str]) -> None:
    assert consulted, "the probe saw the reader consult no column"
    assert documented == consulted, (
        f"read but not documented: {sorted(consulted - documented)}; "
        f"documented but not read: {sorted(documented - consulted)}"
    )


def test_inputs_doc_lists_every_training_column() -> None:
    consulted = _consulted(read_resolved, "training_runs.csv", training.REQUIRED)
    _same(_documented("Training runs"), consulted)


def test_inputs_doc_lists_every_serving_column() -> None:
    required = (*serving.REQUIRED, *serving.ARCH_REQUIRED, "batch_size")
    consulted = _consulted(serving.read_serving_rows, "serving_points.csv", required)
    _same(_documented("Serving points"), consulted)


def test_inputs_doc_lists_every_workload_column(monkeypatch) -> None:
    read_csv = pd.read_csv
    monkeypatch.setattr(pd, "read_csv", lambda *a, **k: Consulted(read_csv(*a, **k)))
    Consulted.names = set()
    workload.read_workload(EXAMPLES / "chat_lengths.csv")
    _same(_documented("Request lengths"), set(Consulted.names))


def test_probe_sees_a_column_the_reader_gains(monkeypatch) -> None:
    """The check above can fail: a y/n column added to the reader is consulted, and so missing
    from the reference."""
    flags = {**training.BEHAVIOUR_FLAGS, "made_up_overlap": "p2p_overlap"}
    monkeypatch.setattr(training, "BEHAVIOUR_FLAGS", flags)
    consulted = _consulted(read_resolved, "training_runs.csv", training.REQUIRED)
    assert "made_up_overlap" in consulted - _documented("Training runs")


def test_output_columns_named_in_readme_and_doc_exist(tmp_path, monkeypatch) -> None:
    """Every prediction column README or docs/inputs.md names by its full name is one the
    batch estimate and the serving batch write."""
    monkeypatch.chdir(ROOT)
    written: set[str] = set()
    for command, example in (("estimate", "training_runs.csv"), ("infer", "serving_points.csv")):
        out = tmp_path / f"{command}.csv"
        result = run_cli(command, "--runs", f"examples/{example}", "--out", str(out))
        assert result.returncode == 0, result.stderr
        written |= set(pd.read_csv(out, nrows=0).columns)
    text = README.read_text() + INPUTS_DOC.read_text()
    named = set(re.findall(r"\b((?:pred|resolved|mem|time)_\w*[a-z])\b", text))
    named = {n for n in named if not n.endswith("_")}
    assert "pred_tokens_per_s_per_gpu" in named
    assert not named - written, f"named but not written: {sorted(named - written)}"


# -- what README states up front ---------------------------------------------------------------


def _intro() -> str:
    """README before its first section: what a reader sees first."""
    return README.read_text().split("\n## ", 1)[0]


def test_readme_states_left_out_accuracy_first() -> None:
    """The up-front figure is the left-out one (each source group predicted by constants
    fitted without it), as the shipped accuracy asset has it; the in-sample one, if given,
    comes after it."""
    figures = json.loads((ASSETS / "accuracy.json").read_text())
    intro = _intro()
    left_out = f"{figures['left_out_median_over_groups_pct']:.1f}%"
    in_sample = f"{figures['median_over_groups_pct']:.1f}%"
    assert left_out in intro, f"README's opening does not give the left-out median {left_out}"
    assert f"{figures['source_groups']} " in intro
    serving = json.loads((ASSETS / "inference_accuracy.json").read_text())
    held_out = f"{serving['inflight_heldout_median_ape_pct']:g}%"
    assert held_out in intro, f"README's opening does not give the serving held-out {held_out}"
    if in_sample in intro and in_sample != left_out:
        assert intro.index(left_out) < intro.index(in_sample)
        assert "in sample" in intro[intro.index(left_out) :].lower()


def test_readme_conventions_match_the_code(tmp_path, monkeypatch) -> None:
    """README says MFU is model FLOP/s over the dense peak of the run's precision, and memory is
    in GiB of 2^30 bytes: the batch estimate bears the first out on rows of several precisions
    (fp8 against the fp8 peak), and every GiB figure divides by the one constant."""
    intro = _intro()
    for words in ("model FLOPs", "dense peak", "GiB", "2^30", "tokens/s/GPU", "ms"):
        assert words.lower() in intro.lower(), words
    assert vocab.GIB == 2**30
    monkeypatch.chdir(ROOT)
    out = tmp_path / "p.csv"
    result = run_cli("estimate", "--runs", "examples/training_runs.csv", "--out", str(out))
    assert result.returncode == 0, result.stderr
    table = pd.read_csv(out, keep_default_na=False)
    assert {"fp8", "bf16", "nvfp4"} <= set(table["precision"])  # several peaks exercised
    gpus = zip(table["gpu"], table["precision"], strict=True)
    peaks = np.array([catalog.get_gpu(g).peak(p) for g, p in gpus])
    assert np.allclose(table["pred_mfu"], table["pred_model_tflops_per_gpu"] / peaks, rtol=1e-4)


def test_readme_python_runs_on_the_examples(monkeypatch) -> None:
    """README's Python block, run as shown from the repository root: it reads the example
    tables and predicts every row."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.DOTALL)
    assert len(blocks) == 1, "README should show one Python block"
    assert _named_in(blocks[0]), "README's Python block reads no example file"
    monkeypatch.chdir(ROOT)
    scope: dict[str, object] = {}
    exec(compile(blocks[0], "README.md (python)", "exec"), scope)
    for name in ("table", "points"):  # estimate_frame and infer_frame over the examples
        frame = scope[name]
        assert isinstance(frame, pd.DataFrame) and len(frame) > 0
        assert (frame["error"] == "").all(), frame["error"].tolist()


def test_dashboard_is_an_extra_readme_names() -> None:
    """optuna-dashboard, which README suggests for a measured search's study, installs with
    the `dashboard` extra and stays out of `dev` (what CI installs)."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert any(req.startswith("optuna-dashboard") for req in extras["dashboard"])
    assert not any(req.startswith("optuna-dashboard") for req in extras["dev"])
    readme = README.read_text()
    assert "optuna-dashboard" in readme and '".[dashboard]"' in readme
