"""Shared helpers: cost-model inputs for catalog models with any layout."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from autoconfig import catalog
from autoconfig.columns import Behaviour, Hardware, hardware_columns, model_columns
from autoconfig.cost import CostInputs

DEFAULT_LAYOUT = {
    "dp": 1,
    "tp": 1,
    "pp": 1,
    "vp": 1,
    "cp": 1,
    "ep": 1,
    "sp": 0,
    "mbs": 1,
    "gbs": 1,
    "seq": 2048,
    "recompute": 0,
    "recompute_layers": 0,
    "zero": 0,
    "fp8": 0,
    "flash": 1,
}


def make_inputs(model: str = "gpt3-175b", gpu: str = "a100-sxm-80gb", **layout) -> CostInputs:
    spec = catalog.get_model(model)
    g = catalog.get_gpu(gpu)
    cols = {
        **model_columns(spec),
        **hardware_columns(Hardware(g, g.cluster)),
        **Behaviour().columns(),
        **DEFAULT_LAYOUT,
        **layout,
    }
    return CostInputs.from_columns({k: np.asarray(v, dtype=float) for k, v in cols.items()})


@pytest.fixture
def inputs():
    return make_inputs


@pytest.fixture
def reference():
    """The published measurements, or a skip saying they are not beside this checkout."""
    from autoconfig.validation import reference_dir

    found = reference_dir()
    if found is None:
        pytest.skip("the published measurements (../shared/reference) are not beside the checkout")
    return found


def _slurm_up() -> str | None:
    """Why SLURM cannot be used here, or None when sinfo sees an idle node."""
    if shutil.which("sbatch") is None:
        return "no sbatch on PATH (CI starts a one-node cluster with .ci/slurm_up.sh)"
    done = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True)
    if done.returncode != 0 or not done.stdout.strip():
        return f"sinfo sees no cluster ({done.stderr.strip()[:200]})"
    return None


@pytest.fixture
def slurm() -> None:
    reason = _slurm_up()
    if reason and os.environ.get("AUTOCONFIG_REQUIRE_SLURM"):
        pytest.fail(f"SLURM is required here but {reason}")
    if reason:
        pytest.skip(reason)


def run_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`autoconfig ARGS` in a fresh interpreter, output captured."""
    return subprocess.run(
        [sys.executable, "-m", "autoconfig.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def assert_user_error(result: subprocess.CompletedProcess, *needles: str) -> None:
    """Bad input: exit code 2 and one line on stderr naming what is wrong, no traceback."""
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
