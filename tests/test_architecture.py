"""The structure holds: imports only point down the layers of docs/architecture.md, and every
layout dimension reaches the command line (estimate and train flags, search --fix), the API,
the cost inputs, the search results, the trainer's configuration and every exporter (so a new
dimension cannot be half-wired)."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: import-linter brings tomli
    import tomli as tomllib  # type: ignore[no-redef]

import numpy as np
import pytest
import typer

from autoconfig import api
from autoconfig.base.errors import UserError
from autoconfig.cli import register
from autoconfig.columns.build import Hardware, training_inputs
from autoconfig.report import exports
from autoconfig.spec import layout
from autoconfig.spec.catalog import get_gpu, get_model
from autoconfig.spec.vocab import Framework
from autoconfig.trainer.config import TrainConfig, config_from_search_row

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "autoconfig"
TOP_LEVEL = {"__init__", "api"}  # the public API: the lazy re-export and its floor of its own


def _layers() -> list[str]:
    """The import-linter contract's floors, top to bottom, each room by name."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = config["contracts"]
    return [room.strip() for floor in contract["layers"] for room in floor.split("|")]


def _lint_imports(cwd: Path) -> subprocess.CompletedProcess[str]:
    lint = Path(sys.executable).with_name("lint-imports")
    command = [str(lint)] if lint.exists() else [sys.executable, "-m", "importlinter.cli"]
    env = {**os.environ, "PYTHONPATH": str(cwd)}
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)


def test_every_room_has_a_floor() -> None:
    rooms = {p.stem for p in PACKAGE.glob("*.py")} | {
        p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()
    }
    missing = rooms - set(_layers()) - {"__init__"}
    assert missing == set(), f"add these to the import-linter layers: {sorted(missing)}"
    loose = {p.stem for p in PACKAGE.glob("*.py")} - TOP_LEVEL
    assert loose == set(), f"modules loose at the package root: {sorted(loose)}"


def test_imports_point_down() -> None:
    """import-linter's layers contract in pyproject.toml holds (function-level imports too)."""
    result = _lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_layering_check_sees_an_import_that_runs_back_up(tmp_path: Path) -> None:
    package = tmp_path / "house"
    for floor in ("high", "low"):
        (package / floor).mkdir(parents=True)
        (package / floor / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "low" / "memory.py").write_text(
        "import json\n\n\ndef f():\n    from house.high import x\n"
    )
    (package / "high" / "x.py").write_text("from house.low import memory\n")
    (tmp_path / ".importlinter").write_text(
        "[importlinter]\nroot_package = house\n\n[importlinter:contract:floors]\n"
        "name = floors\ntype = layers\ncontainers = house\nlayers =\n    high\n    low\n"
    )
    result = _lint_imports(tmp_path)
    assert result.returncode != 0
    assert "house.low.memory -> house.high.x" in result.stdout


# -- every dimension is wired through --------------------------------------------------------

MODEL = "mixtral-8x7b"  # MoE, so expert parallelism means something
BASE = {"dp": 2, "tp": 2, "pp": 2, "vp": 1, "cp": 1, "ep": 1, "etp": 1, "sp": False, "mbs": 1}
BASE |= {"recompute": "none", "recompute_layers": 0, "zero": 0, "optimizer_state": "fp32"}
BASE |= {"offload": "none", "hybrid_cp": False, "activation_offload": False}
OTHER = {"dp": 1, "tp": 4, "pp": 4, "vp": 2, "cp": 2, "ep": 2, "etp": 2, "sp": True, "mbs": 2}
OTHER |= {"recompute": "selective", "recompute_layers": 4, "zero": 1, "optimizer_state": "bf16"}
OTHER |= {"offload": "optimizer", "hybrid_cp": True, "activation_offload": True}


def test_every_dimension_has_a_varied_value() -> None:
    assert set(BASE) == set(OTHER) == set(layout.NAMES)


@pytest.mark.parametrize("name", layout.NAMES)
def test_dimension_reaches_the_command_line_and_the_api(name: str) -> None:
    """`estimate` and `train` take it as a flag, `api.estimate` as a parameter, and `search
    --fix` (layout.parse_fix) as a key with its value."""
    commands = typer.main.get_command(register()).commands
    flag = "--" + name.replace("_", "-")
    for command in ("estimate", "train"):
        flags = {opt for param in commands[command].params for opt in param.opts}
        assert flag in flags, f"`autoconfig {command}` has no {flag}"
    assert name in inspect.signature(api.estimate).parameters, f"api.estimate has no {name}"
    fixed = layout.parse_fix([f"{name}={OTHER[name]}"])
    assert layout.BY_NAME[name].plain(fixed[name]) == OTHER[name]


@pytest.mark.parametrize("name", layout.NAMES)
def test_dimension_reaches_the_cost_inputs(name: str) -> None:
    gpu = get_gpu("h100-sxm-80gb")
    changed = BASE | {name: OTHER[name]}
    if name == "recompute_layers":
        changed["recompute"] = "full"
    table = layout.frame_of([BASE, changed])
    x = training_inputs(get_model(MODEL), Hardware(gpu, gpu.cluster), table, 64, 4096)
    column = np.broadcast_to(getattr(x, name), (2,))
    assert column[0] != column[1]


def test_every_dimension_is_a_search_result_column() -> None:
    table = api.search("tiny-llama", 8, gbs=16).table
    assert set(layout.NAMES) <= set(table.columns)


@pytest.mark.parametrize("name", layout.NAMES)
def test_dimension_reaches_the_trainer_configuration(name: str) -> None:
    """The trainer's configuration has the dimension and takes it from a search row (whether
    the bundled trainer can run the value is its own check, tested with the trainer)."""
    assert name in TrainConfig.model_fields
    row = BASE | {name: OTHER[name]}
    if name == "recompute_layers":
        row["recompute"] = "full"
    cfg = TrainConfig(model=MODEL, seq_len=128, gbs=64, **layout.plain(row))
    assert layout.BY_NAME[name].plain(getattr(cfg, name)) == row[name]
    runnable = {**layout.plain(layout.Layout(zero=0).model_dump()), "mbs": 2}
    checked = config_from_search_row(runnable, "tiny-llama", seq_len=128, gbs=8)
    assert layout.plain(checked.model_dump()) == runnable


@pytest.mark.parametrize("framework", list(Framework))
@pytest.mark.parametrize("name", layout.NAMES)
def test_dimension_is_declared_for_every_exporter(name: str, framework: Framework) -> None:
    """Each framework says how it writes the dimension (or that it derives it); a value it
    cannot run is refused with the framework and dimension named, never dropped."""
    d = layout.BY_NAME[name]
    # or takes another framework's (exports.DERIVED: Primus writes Megatron-LM's as overrides)
    assert framework in d.flags or framework in exports.DERIVED, (
        f"{name} has no {framework.value} flags"
    )
    for row in (BASE, BASE | {name: OTHER[name]}):
        try:
            text = exports.export(framework, row, 32, 64, 4096, "bf16")
        except UserError as exc:
            # the refusal names the framework and a dimension of the row it cannot run
            named = [n for n in layout.NAMES if f" {n} " in f" {exc} "]
            assert framework.value in str(exc) and named, str(exc)
            assert all(exports.refuses(framework, n, row[n]) for n in named), str(exc)
        else:
            assert text


def test_no_room_shadows_a_public_name() -> None:
    """`autoconfig.search` is the API's function: a subpackage of the same name would replace it
    as the package attribute once anything imported the subpackage."""
    import autoconfig

    rooms = {p.stem for p in PACKAGE.glob("*.py")} | {p.name for p in PACKAGE.iterdir()}
    assert set(autoconfig.__all__) & rooms == set()
