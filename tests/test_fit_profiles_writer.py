"""scripts/fit_profiles.py writes fitted values into a GPU profile in place: the value changes,
the comments and hand-written text around it do not, and a missing key is one error naming
the file."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent

PROFILE = """\
name: test-gpu
# a comment above the block
efficiency:
  gemm: 0.7
  memory: 0.5  # fitted, kept
  inter_node_bus: 0.59163
  provenance: 'hand-written,
    two lines'
cluster:
  inter_node_bus: 9.0  # not the efficiency block's
"""


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "fit_profiles", ROOT / "scripts" / "fit_profiles.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("fit_profiles", module)
    spec.loader.exec_module(module)
    return module


def test_values_change_in_place_and_nothing_else_does() -> None:
    out = _script().set_efficiency(PROFILE, {"memory": 0.69, "inter_node_bus": 0.44704})
    assert "  memory: 0.69  # fitted, kept\n" in out
    assert "  inter_node_bus: 0.44704\n" in out
    assert "  inter_node_bus: 9.0  # not the efficiency block's\n" in out
    assert "# a comment above the block" in out and "two lines'" in out
    assert out.replace("0.69", "0.5").replace("0.44704", "0.59163") == PROFILE
    loaded = yaml.safe_load(out)
    assert loaded["efficiency"]["memory"] == 0.69
    assert loaded["cluster"]["inter_node_bus"] == 9.0


def test_a_key_the_block_lacks_is_one_error_naming_the_file() -> None:
    with pytest.raises(ValueError, match=r"^x\.yaml: kernel_us is not in its efficiency block"):
        _script().set_efficiency(PROFILE, {"kernel_us": 1.0}, "x.yaml")
