"""The structure holds: imports only point down the layers of docs/architecture.md, and every
layout dimension reaches the cost inputs, the search results, the trainer's configuration and
every exporter (so a new dimension cannot be half-wired)."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from autoconfig import api, layout
from autoconfig.catalog import get_gpu, get_model
from autoconfig.columns import Hardware, training_inputs
from autoconfig.errors import UserError
from autoconfig.report import exports
from autoconfig.trainer.config import TrainConfig, config_from_search_row
from autoconfig.vocab import Framework

PACKAGE = Path(__file__).resolve().parent.parent / "autoconfig"

# Bottom to top. A module may import its own room (package or module) and anything on a lower
# floor, never a room on its own floor or above.
FLOORS: list[set[str]] = [
    {"errors", "resources", "intmath"},
    {"vocab", "checks", "fileio", "folderlock"},
    {"layout", "machine"},
    {"cost"},
    {"specs", "kernel_catalog"},
    {"catalog"},
    {"kernel_index"},
    {"columns", "fit"},
    {"frameworks"},
    {"frame"},
    {"resolve", "training", "trainer"},
    {"validation", "micro_batches"},
    {"serve", "leave_out"},
    {"measure"},
    {"api"},
    {"plan", "compare"},
    {"report"},
    {"cli"},
]
FLOOR = {room: i for i, rooms in enumerate(FLOORS) for room in rooms}


def _room(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0].removesuffix(".py")


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, imported autoconfig room) of every import in a file, in functions too."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        rooms = {
            parts[1]
            for parts in (name.split(".") for name in names)
            if parts[0] == "autoconfig" and len(parts) > 1 and parts[1] in FLOOR
        }
        out += [(node.lineno, room) for room in sorted(rooms)]
    return out


def test_every_room_has_a_floor() -> None:
    rooms = {_room(p) for p in PACKAGE.rglob("*.py")} - {"__init__"}
    rooms |= {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert rooms <= set(FLOOR), f"add these to FLOORS: {sorted(rooms - set(FLOOR))}"


def _upward(path: Path, room: str) -> list[str]:
    """The imports in `path` (a module of `room`) that reach its own floor or above."""
    return [
        f"{path}:{line} -> autoconfig.{target}"
        for line, target in _imports(path)
        if target != room and FLOOR[target] >= FLOOR[room]
    ]


def test_imports_point_down() -> None:
    upward = []
    for path in PACKAGE.rglob("*.py"):
        room = _room(path)
        if room != "__init__":  # the package's lazy public API sits above everything
            upward += _upward(path, room)
    assert not upward, "imports that run back up:\n" + "\n".join(sorted(upward))


def test_the_layering_check_sees_an_import_that_runs_back_up(tmp_path: Path) -> None:
    module = tmp_path / "memory.py"  # as if in autoconfig/cost/
    module.write_text("import numpy\n\n\ndef f():\n    from autoconfig.api import search\n")
    assert _upward(module, "cost") == [f"{module}:5 -> autoconfig.api"]
    module.write_text("from autoconfig.cost import evaluate\nfrom autoconfig import layout\n")
    assert _upward(module, "cost") == []


# -- every dimension is wired through --------------------------------------------------------

MODEL = "mixtral-8x7b"  # MoE, so expert parallelism means something
BASE = {"dp": 2, "tp": 2, "pp": 2, "vp": 1, "cp": 1, "ep": 1, "etp": 1, "sp": False, "mbs": 1}
BASE |= {"recompute": "none", "recompute_layers": 0, "zero": 0}
OTHER = {"dp": 1, "tp": 4, "pp": 4, "vp": 2, "cp": 2, "ep": 2, "etp": 2, "sp": True, "mbs": 2}
OTHER |= {"recompute": "selective", "recompute_layers": 4, "zero": 1}


def test_every_dimension_has_a_varied_value() -> None:
    assert set(BASE) == set(OTHER) == set(layout.NAMES)


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
    assert framework in d.flags, f"{name} has no {framework.value} flags"
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
