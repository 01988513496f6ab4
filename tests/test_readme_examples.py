"""Checks that the command outputs README.md quotes are what the commands print now, through
scripts/readme_examples.py; when they differ, `python scripts/readme_examples.py` rewrites
them."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _script() -> ModuleType:
    """scripts/readme_examples.py as a module (scripts/ is not a package)."""
    path = ROOT / "scripts" / "readme_examples.py"
    spec = importlib.util.spec_from_file_location("readme_examples", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


readme_examples = _script()


def test_every_example_is_marked_and_names_one_command() -> None:
    """Cheap, in the default run: each example has its block in README and README has exactly
    one command for it, so the slow check below runs what README shows."""
    readme = readme_examples.README.read_text()
    assert set(readme_examples.quoted(readme)) == set(readme_examples.EXAMPLES)
    for example in readme_examples.EXAMPLES.values():
        assert readme_examples.command_of(example, readme)[0] == "autoconfig"


def test_citations_are_shortened() -> None:
    line = "gbs: 512 (GPT-3: 3.2M, Llama 2: 4M; Brown et al. 2020, Table 2.1; Touvron et al. 2023)"
    assert readme_examples.shorten(line) == "gbs: 512 (GPT-3: 3.2M, Llama 2: 4M; ...)"
    assert readme_examples.shorten("dp64 (x; y)") == "dp64 (x; y)"


@pytest.mark.slow
def test_readme_quotes_what_the_commands_print() -> None:
    """README's `plan` and `estimate --compare` outputs (plan is most of the time: one search
    per GPU count tried)."""
    diff = readme_examples.differences(readme_examples.README.read_text())
    assert not diff, (
        "README's quoted outputs are stale; `python scripts/readme_examples.py` rewrites them:\n"
        + diff
    )
