"""Helpers the test files share: cost-model inputs for catalog models with any layout, the CLI run
in-process or in a fresh interpreter, the check every refusal must pass, and the bundled
trainer's test settings. Imported as `from helpers import ...`: pytest puts tests/ on sys.path
(rootdir-relative, no package), under `pytest` and `python -m pytest` alike."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from hypothesis import settings

from autoconfig.cli.app import execute
from autoconfig.columns import kernel_index
from autoconfig.columns.build import Behaviour, Hardware, hardware_columns, model_columns
from autoconfig.cost import CostInputs
from autoconfig.spec import catalog

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
    columns = {k: np.asarray(v, dtype=float) for k, v in cols.items()}
    return CostInputs.from_columns({**columns, "kernels": kernel_index.kernel_set()})


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """`autoconfig ARGS` in this process, through the function the entry point runs
    (autoconfig.cli.app.execute: the same exit codes and one-line refusals), its stdout and
    stderr captured. A fresh interpreter costs seconds of imports (torch among them) a call;
    only the tests about start-up itself need one (run_cli_process). An exception that escapes
    the CLI is raised here, so a test sees it as the traceback a user would."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = execute(list(args))
    return subprocess.CompletedProcess(["autoconfig", *args], code, out.getvalue(), err.getvalue())


def run_cli_process(
    *args: str, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`python -m autoconfig.cli ARGS` in a fresh interpreter, output captured: for what only a
    process of its own shows (start-up imports, a process tree killed from outside)."""
    return subprocess.run(
        [sys.executable, "-m", "autoconfig.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


HOLD = """
import sys, time
from autoconfig.base.folderlock import folder_lock
with folder_lock(sys.argv[1]):
    print("held", flush=True)
    time.sleep(120)
"""


@contextlib.contextmanager
def held_elsewhere(folder: Path) -> Iterator[subprocess.Popen[str]]:
    """`folder` held by another process's folder lock for the duration (its Popen yielded, so
    a test can name its pid); killed after, which releases the lock as a crash would."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    other = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(folder)], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert other.stdout is not None and other.stdout.readline().strip() == "held"
        yield other
    finally:
        other.kill()
        other.wait()


def assert_user_error(result: subprocess.CompletedProcess, *needles: str) -> None:
    """Bad input: exit code 2 and one line on stderr naming what is wrong, no traceback."""
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


# -- the bundled trainer's runs in tests (tests/test_trainer*.py) -------------------------------

STEPS = 3
BASE = {"steps": STEPS, "warmup": 1, "device": "cpu", "precision": "fp32", "gbs": 4}
# Plain SGD: unlike Adam (which normalises updates) its update shows any error in a gradient.
# The tiny models' gradients are small (init std 0.02): at lr 10 three steps move the loss by
# 1.1e-2 relative from an untrained run (at lr 0.01 a step moved 2-layer tiny-llama's loss by
# 1.3e-6, inside the tolerance below).
TRAIN = {"optimizer": "sgd", "lr": 10.0}

# Every parallel run sums and shards in another order than one process, so fp32 losses differ
# by rounding only: measured at most 6.2e-8 relative after 3 steps (tp2+sp, pp2, dp2). A wrong
# gradient shows more: dropping the sequence-parallel sum of one norm's weight gradient moves
# the third loss by 2.9e-5 relative. 5e-6 sits between the two.
RTOL = 5e-6


# -- fuzzing (tests/test_fuzz_*.py; the profiles are in tests/conftest.py) ----------------------

THOROUGH_EXAMPLES = 1000  # max_examples of the thorough profile ("dev")


def fuzz_examples(full: int) -> int:
    """A fuzz test's draws under the loaded Hypothesis profile: `full` (its count in the
    thorough profile) scaled by the profile's max_examples, at least one."""
    return max(1, round(full * settings.default.max_examples / THOROUGH_EXAMPLES))
