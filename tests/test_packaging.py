"""autoconfig works as an installed wheel: built from this checkout, installed (not editable) into
a folder of its own, and run from a folder outside the checkout with only that folder added to
the interpreter's path, its catalog, search space and report assets come from the package
itself."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _backend_runs_here() -> bool:
    """Whether pyproject's build backend runs in this environment: setuptools 68 or later with
    bdist_wheel (its own from 70.1, else the wheel package's). Then the wheel is built here, no
    download and seconds faster; else (a fresh Python 3.11 venv holds setuptools 65) in pip's
    isolated build environment."""
    try:
        version = importlib.metadata.version("setuptools")
    except importlib.metadata.PackageNotFoundError:
        return False
    release = tuple(int(part) for part in version.split(".")[:2] if part.isdigit())
    has_wheel = importlib.util.find_spec("wheel") is not None
    return release >= (70, 1) or (release >= (68, 0) and has_wheel)


def test_installed_wheel_searches_serves_and_lists_outside_the_checkout(tmp_path: Path) -> None:
    dist, site, elsewhere = tmp_path / "dist", tmp_path / "site", tmp_path / "elsewhere"
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(ROOT)]
    isolation = ["--no-build-isolation"] if _backend_runs_here() else []
    done = subprocess.run([*build, *isolation], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    (wheel,) = dist.glob("autoconfig-*.whl")
    # pip's --target: the wheel's files (and its `autoconfig` script, under bin/) in a folder
    # of their own, run by this interpreter, which brings the dependencies (numpy, torch, ...)
    # whether it is a virtual environment or not. A venv made from inside another one would
    # see the base interpreter's packages, not the outer venv's (no pandas there).
    install = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index"]
    subprocess.run([*install, "--target", str(site), str(wheel)], check=True, capture_output=True)
    python, cli = sys.executable, site / "bin" / "autoconfig"
    elsewhere.mkdir()
    # Only the installed folder is added to the path: ahead of site-packages, so the checkout's
    # editable install (if any) is not what runs, which the first check below makes sure of.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "AUTOCONFIG_PROFILES")}
    env["PYTHONPATH"] = str(site)

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            list(args), cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300
        )

    where = run(str(python), "-c", "import autoconfig.spec.catalog as c; print(c.__file__)")
    assert where.stdout.startswith(str(site)), where.stdout + where.stderr

    search = run(str(cli), "search", "--model", "gpt3-175b", "--gpus", "1024", "--out", "out")
    assert search.returncode == 0, search.stderr
    best = json.loads((elsewhere / "out" / "best.json").read_text())
    assert best["best"]["rank"] == 1 and best["inputs"]["model"] == "gpt3-175b"
    page = (elsewhere / "out" / "report.html").read_text()
    assert "Known accuracy" in page  # the packaged accuracy asset was found

    serve = run(
        str(cli), "infer", "--model", "llama2-70b", "--gpus", "8",
        "--input-len", "512", "--output-len", "64",
    )  # fmt: skip
    assert serve.returncode == 0, serve.stderr
    assert "tok/s/GPU" in serve.stdout

    models = run(str(cli), "models")
    assert models.returncode == 0 and "mixtral-8x22b" in models.stdout
