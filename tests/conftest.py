"""Shared fixtures (published measurements, SLURM) and the Hypothesis profiles every property and
fuzz test runs under. The helpers test files import live in tests/helpers.py."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import THOROUGH_EXAMPLES, make_inputs
from hypothesis import HealthCheck, settings
from hypothesis.database import DirectoryBasedExampleDatabase

ROOT = Path(__file__).resolve().parent.parent

# Hypothesis profiles, chosen with HYPOTHESIS_PROFILE (or pytest --hypothesis-profile):
# - "ci" (the default): 2.5% of the draws, a seed that changes with the commit (a rerun of
#   one commit draws the same, the next commit draws others: over many commits the fuzzing
#   covers more than one long fixed run), and failures kept in .hypothesis/examples so the next
#   run replays them first;
# - "dev": the thorough run, every fuzz test at its full count (5,000+ CLI invocations, about
#   20 minutes on two cores), for a change to the CLI's checks or before a release.
# A fuzz test's count is its thorough count scaled by the profile's max_examples against
# THOROUGH_EXAMPLES (helpers.fuzz_examples).
DATABASE = DirectoryBasedExampleDatabase(str(ROOT / ".hypothesis" / "examples"))
settings.register_profile(
    "dev",
    max_examples=THOROUGH_EXAMPLES,
    deadline=None,
    derandomize=False,
    database=DATABASE,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("ci", settings.get_profile("dev"), max_examples=25)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def _commit() -> str | None:
    done = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True
    )
    if done.returncode != 0 or not done.stdout.strip():
        return None
    return done.stdout.strip()


WORKER = os.environ.get("PYTEST_XDIST_WORKER")  # gw0, gw1, ... in an xdist worker
if WORKER:
    # One-rank runs in a test's own process and the measured search's trials (submitit,
    # SLURM) start torch.distributed on MASTER_PORT, 29500 when unset (trainer/run.py): two
    # workers would race for it, and one fail with "failed to listen". Each worker gets its
    # own port (its tests run one at a time, as a serial run's do).
    os.environ["MASTER_PORT"] = str(29510 + int(WORKER.removeprefix("gw")))
    # A worker has one core's share of the machine: torch in it (and in the processes it
    # starts) on one thread, as torchrun gives each rank. With a thread per core in each
    # worker, OpenMP threads spin against the other worker's: a one-process training step in
    # a test took 10-20x as long as alone. Set before any test module imports torch.
    os.environ["OMP_NUM_THREADS"] = "1"


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """Under "ci", the commit's hash seeds every Hypothesis test unless --hypothesis-seed is
    given (Hypothesis's own plugin reads the option after this hook). Outside a checkout the
    seed stays random."""
    if settings.get_current_profile_name() != "ci" or config.getoption("hypothesis_seed"):
        return
    commit = _commit()
    if commit:
        config.option.hypothesis_seed = commit


@pytest.fixture
def inputs():
    return make_inputs


@pytest.fixture
def reference():
    """The published measurements, or a skip saying they are not beside this checkout."""
    from autoconfig.calibrate.validation import reference_dir

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
